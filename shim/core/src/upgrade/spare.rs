//! Spare connections: the RDMA half of a client's next connection to a peer, set up ahead of
//! the app's `connect()`.
//!
//! Most of an upgraded connect's time is its RDMA connect (address and route resolution, the
//! connection manager's round trips, a queue pair and registered rings on both sides), made
//! before the kernel connect because the server's `accept()` must find the registration it
//! claims. A process that connects to a peer once usually does again (a connection per
//! request, a pool that grows, a migration's channels). So after a connection to `peer`
//! upgraded, the client makes the next one's RDMA connect at once, in the background:
//!
//! - A *placeholder* TCP socket, bound to the source address the route to `peer` leaves from
//!   (port 0: the kernel picks one now) with `SO_REUSEADDR`, holds the port, so the HELLO can
//!   name the 4-tuple the next connection will have. It never connects and carries nothing.
//! - The RDMA connect with that HELLO runs as any other: the server registers the address,
//!   allocates, accepts; nothing waits for it.
//! - The app's next `connect()` of an unbound socket to `peer` takes the spare: its socket is
//!   bound to the placeholder's address (with `SO_REUSEADDR` for that bind only, then the app's
//!   own setting again), the placeholder is closed, and the connection goes on from the
//!   established RDMA connection: kernel connect, CLAIM, proof, CONFIRM, as before. The
//!   fabric-trust proof is unchanged: the server's registration is still only a claim on an
//!   address until the TCP connection proves it.
//!
//! One spare per destination and socket family, at most [`MAX_SPARES`] in all; a spare older
//! than [`MAX_AGE`] is aborted when the pool is next used (the server drops an unclaimed
//! registration after [`super::PENDING_TIMEOUT`], and the placeholder's age bounds the
//! registration's). A spare is made only while the pinned-memory budget keeps room for
//! [`HEADROOM`] more connections beside it, so a spare never makes a real connection fall
//! back with `MEMLOCK`. `STREAMSHIM_SPARE=0` turns spares off.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use libc::c_int;
use rdma_streams_transport::engine::{Conn, ConnectRequest, Handshake};

use super::engine::engine;
use super::now;
use crate::fdtable::{self, SHIM_OWNED};
use crate::forksafe::{ForkSafe, SLOTS};
use crate::log::{Level, log_at};
use crate::negotiation::{self, Hello, Message};
use crate::policy::canonical_ip;
use crate::sys;

/// Destinations with a spare at once.
pub const MAX_SPARES: usize = 16;
/// The oldest spare a connect takes (well below the server's 10 s for an unclaimed
/// registration, which starts after the spare was made).
pub const MAX_AGE: Duration = Duration::from_secs(5);
/// A spare taken younger than this: the process connects to the peer in quick succession.
pub const QUICK: Duration = Duration::from_millis(20);
/// Connections the pinned-memory budget must still hold beside a new spare.
pub const HEADROOM: u64 = 4;

/// `STREAMSHIM_SPARE` (set at the decision; off until then).
static ENABLED: AtomicBool = AtomicBool::new(false);

/// Turns spares on or off (the decision, from `STREAMSHIM_SPARE`).
pub fn set_enabled(on: bool) {
    ENABLED.store(on, Ordering::Release);
}

/// A spare: the placeholder holding the address, and the RDMA connection whose HELLO names it.
pub(super) struct Spare {
    placeholder: OwnedFd,
    client: SocketAddr,
    conn: Conn,
    nonce: u64,
    made: Instant,
}

impl Spare {
    /// Aborts the RDMA connection and closes the placeholder.
    fn discard(self) {
        self.conn.abort();
        fdtable::clear(self.placeholder.as_raw_fd());
    }
}

/// What a connect takes: the app's socket is bound to `client` (the HELLO's address), `conn`
/// is the RDMA connection (established or on its way) whose ACCEPT must carry `nonce`.
pub(super) struct Taken {
    pub client: SocketAddr,
    pub conn: Conn,
    pub nonce: u64,
    /// How long ago the spare was made.
    pub age: Duration,
}

/// Spares by (destination, whether the app socket is IPv6).
type Pool = BTreeMap<(SocketAddr, bool), Spare>;

static POOL: ForkSafe<Pool> = ForkSafe::new([const { Mutex::new(BTreeMap::new()) }; SLOTS]);

/// Drops (aborts) the spares older than [`MAX_AGE`] or whose RDMA connection ended.
fn sweep(pool: &mut Pool, now: Instant) {
    let old: Vec<_> = pool
        .iter()
        .filter(|(_, s)| now.saturating_duration_since(s.made) >= MAX_AGE || !s.conn.is_alive())
        .map(|(k, _)| *k)
        .collect();
    for k in old {
        if let Some(s) = pool.remove(&k) {
            s.discard();
        }
    }
}

/// Takes the spare for `peer` when the app's socket `fd` is unbound, of the spare's family,
/// and its route to `peer` leaves from the spare's address: binds `fd` to that address and
/// closes the placeholder. None (and `fd` untouched) otherwise.
pub(super) fn take(fd: c_int, peer: SocketAddr) -> Option<Taken> {
    if !ENABLED.load(Ordering::Acquire) {
        return None;
    }
    let local = sys::local_addr(fd)?;
    if local.port() != 0 || !local.ip().is_unspecified() {
        return None;
    }
    let v6 = local.is_ipv6();
    let spare = {
        let mut pool = POOL.lock();
        sweep(&mut pool, now());
        pool.remove(&(peer, v6))?
    };
    if super::client::route_source(peer, local) != Some(spare.client.ip()) {
        spare.discard();
        return None;
    }
    if let Err(e) = bind_beside(fd, spare.client) {
        log_at!(
            Level::Debug,
            "spare for {peer}: binding fd {fd} to {} failed ({e})",
            spare.client
        );
        spare.discard();
        return None;
    }
    fdtable::clear(spare.placeholder.as_raw_fd());
    drop(spare.placeholder);
    crate::stats::Stats::global().add_spare_connect();
    Some(Taken {
        client: spare.client,
        conn: spare.conn,
        nonce: spare.nonce,
        age: now().saturating_duration_since(spare.made),
    })
}

/// Binds the app's socket `fd` to `addr`, which the placeholder holds: `SO_REUSEADDR` for the
/// bind only (both sockets have it; neither listens), then the app's setting again (turning an
/// option off on a live socket does not fail; if it did, the bind stands and it is logged).
fn bind_beside(fd: c_int, addr: SocketAddr) -> std::io::Result<()> {
    let was = sys::reuse_addr(fd).unwrap_or(false);
    if !was {
        sys::set_reuse_addr(fd, true)?;
    }
    let bound = sys::bind(fd, addr);
    if !was && let Err(e) = sys::set_reuse_addr(fd, false) {
        log_at!(
            Level::Info,
            "fd {fd}: SO_REUSEADDR stays on after the spare's bind ({e})"
        );
    }
    bound
}

/// After a connection from `client` to `peer` upgraded: makes the spare for the next one, if
/// spares are on, the pool has none for the destination and room, and the budget holds it.
pub(super) fn replenish(peer: SocketAddr, client: SocketAddr, reuse_wait: Option<Duration>) {
    if !ENABLED.load(Ordering::Acquire) {
        return;
    }
    let key = (peer, client.is_ipv6());
    {
        let mut pool = POOL.lock();
        sweep(&mut pool, now());
        if pool.contains_key(&key) || pool.len() >= MAX_SPARES {
            return;
        }
    }
    let Some(engine) = engine() else {
        return;
    };
    let config = engine.config();
    if let Some(limit) = config.memlock_limit {
        let need = config.pinned_per_connection().saturating_mul(HEADROOM);
        if engine.pinned().saturating_add(need) > limit {
            return;
        }
    }
    let Some((placeholder, addr)) = placeholder(client.ip()) else {
        return;
    };
    let nonce = negotiation::new_nonce();
    let conn = engine.connect(ConnectRequest {
        dst: SocketAddr::new(canonical_ip(peer.ip()), peer.port()),
        src: Some(SocketAddr::new(canonical_ip(addr.ip()), 0)),
        payload: Message::Hello(Hello {
            flags: 0,
            nonce,
            client: addr,
        })
        .encode(),
        resolve_timeout: super::negotiate_timeout(),
        handshake: Handshake::Confirm,
        unattached_timeout: Some(MAX_AGE),
        reuse_wait,
    });
    let spare = Spare {
        placeholder,
        client: addr,
        conn,
        nonce,
        made: now(),
    };
    let mut pool = POOL.lock();
    if pool.contains_key(&key) {
        // Another thread's connect made one meanwhile.
        drop(pool);
        spare.discard();
        return;
    }
    pool.insert(key, spare);
}

/// A placeholder socket bound to `ip` (port 0: the kernel picks it) with `SO_REUSEADDR`,
/// above the app's numbers and the shim's: its address.
fn placeholder(ip: IpAddr) -> Option<(OwnedFd, SocketAddr)> {
    let fd = sys::move_high(sys::tcp_socket(ip.is_ipv6()).ok()?);
    fdtable::set(fd.as_raw_fd(), SHIM_OWNED);
    let made = sys::set_reuse_addr(fd.as_raw_fd(), true)
        .and_then(|()| sys::bind(fd.as_raw_fd(), SocketAddr::new(ip, 0)));
    let addr = sys::local_addr(fd.as_raw_fd()).filter(|a| a.port() != 0);
    match (made, addr) {
        (Ok(()), Some(addr)) => Some((fd, addr)),
        _ => {
            fdtable::clear(fd.as_raw_fd());
            None
        }
    }
}

/// Upgraded client connections of this process by app fd: their destination and source.
static LIVE: ForkSafe<BTreeMap<c_int, (SocketAddr, SocketAddr)>> =
    ForkSafe::new([const { Mutex::new(BTreeMap::new()) }; SLOTS]);

/// The connection on `fd` from `client` to `peer` upgraded; `took` is the age of the spare its
/// connect took, if any. The next spare is made now when the process connects to the peer in
/// quick succession (the spare it took was younger than [`QUICK`]) or holds other connections
/// to it (a pool that grows), or, when the engine reuses finished connections' queue pairs
/// (docs/shim-protocol.md, "Reused connections"), when this connect took a spare at all (the
/// process makes connection after connection): then it takes a finished connection's queue
/// pair, a message each way, or waits [`QUICK`] for one to finish before it makes a connect
/// request. Else the spare is made when this connection closes ([`closed`]; its own queue
/// pair then carries it), so that a spare's setup, which runs on the same engine threads, does
/// not delay a connection's first exchange and a single long connection pins no spare beside
/// it.
pub(super) fn upgraded(fd: c_int, peer: SocketAddr, client: SocketAddr, took: Option<Duration>) {
    if !ENABLED.load(Ordering::Acquire) {
        return;
    }
    let others = {
        let mut live = LIVE.lock();
        let n = live.values().filter(|(p, _)| *p == peer).count();
        live.insert(fd, (peer, client));
        n
    };
    if others > 0 || took.is_some_and(|age| age < QUICK) {
        replenish(peer, client, None);
    } else if took.is_some() && reusing() {
        replenish(peer, client, Some(QUICK));
    }
}

/// Whether the engine keeps finished connections' queue pairs for the next ones.
fn reusing() -> bool {
    engine().is_some_and(|e| e.config().reuse_links)
}

/// The app closed `fd` (or replaced its number): an upgraded client connection's peer gets
/// its spare now, if it has none.
pub(super) fn closed(fd: c_int) {
    let Some((peer, client)) = LIVE.lock().remove(&fd) else {
        return;
    };
    // This connection's own queue pair is about to be parked: the spare waits for it.
    replenish(peer, client, reusing().then_some(QUICK));
}

/// In a fork child: the spares' RDMA connections are the parent's (forgotten, never aborted
/// from here); the child's copies of the placeholders are closed.
pub(super) fn after_fork_child() {
    if let Some(mut live) = LIVE.after_fork() {
        live.clear();
    }
    if let Some(mut pool) = POOL.after_fork() {
        for (_, s) in std::mem::take(&mut *pool) {
            fdtable::clear(s.placeholder.as_raw_fd());
            drop(s.placeholder);
            std::mem::forget(s.conn);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, TcpListener};

    fn loopback() -> IpAddr {
        IpAddr::V4(Ipv4Addr::LOCALHOST)
    }

    #[test]
    fn a_placeholder_holds_its_port_against_other_binds() {
        let (held, addr) = placeholder(loopback()).expect("a placeholder");
        assert_ne!(addr.port(), 0);
        assert_eq!(fdtable::get(held.as_raw_fd()), SHIM_OWNED);
        let other = sys::tcp_socket(false).unwrap();
        let e = sys::bind(other.as_raw_fd(), addr).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EADDRINUSE), "{e}");
        fdtable::clear(held.as_raw_fd());
    }

    #[test]
    fn the_app_socket_takes_the_placeholders_address_and_keeps_its_own_setting() {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        for app_reuse in [false, true] {
            let (held, addr) = placeholder(loopback()).expect("a placeholder");
            let app = sys::tcp_socket(false).unwrap();
            sys::set_reuse_addr(app.as_raw_fd(), app_reuse).unwrap();
            bind_beside(app.as_raw_fd(), addr).unwrap();
            assert_eq!(sys::local_addr(app.as_raw_fd()), Some(addr));
            assert_eq!(sys::reuse_addr(app.as_raw_fd()), Some(app_reuse));
            fdtable::clear(held.as_raw_fd());
            drop(held);
            // The connection leaves from the address the HELLO named.
            let (rc, err) = sys::connect_for_test(app.as_raw_fd(), listener.local_addr().unwrap());
            assert_eq!((rc, err), (0, 0));
            let (_peer, from) = listener.accept().unwrap();
            assert_eq!(from, addr);
        }
    }

    #[test]
    fn a_bind_that_fails_leaves_the_app_setting_as_it_was() {
        let app = sys::tcp_socket(false).unwrap();
        // An IPv6 address cannot be bound on an IPv4 socket.
        let e = bind_beside(app.as_raw_fd(), "[::1]:9".parse().unwrap()).unwrap_err();
        assert!(e.raw_os_error().is_some(), "{e}");
        assert_eq!(sys::reuse_addr(app.as_raw_fd()), Some(false));
        assert_eq!(sys::local_addr(app.as_raw_fd()).map(|a| a.port()), Some(0));
    }

    #[test]
    fn spares_are_off_until_the_decision_turns_them_on() {
        let app = sys::tcp_socket(false).unwrap();
        let peer: SocketAddr = "127.0.0.1:9".parse().unwrap();
        assert!(!ENABLED.load(Ordering::Acquire));
        assert!(take(app.as_raw_fd(), peer).is_none());
        assert_eq!(sys::local_addr(app.as_raw_fd()).map(|a| a.port()), Some(0));
    }
}
