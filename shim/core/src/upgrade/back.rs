//! Connections through a Kubernetes Service's virtual IP (docs/shim-protocol.md, "Services").
//!
//! Only the kernel's NAT knows which backend a connection to a ClusterIP reaches, so the client
//! cannot make the RDMA connection; the backend can: its `accept()` returns the client's own
//! address. So the roles of the RDMA connection turn round, and nothing else does:
//!
//! - The client ([`connect`]), whose destination is in `STREAMSHIM_SERVICE_CIDRS`, binds its
//!   socket (the 4-tuple's C:c known before the SYN), listens for one RDMA connection at C:c
//!   in the connection manager's IB port space ([`Engine::expect`]), and offers in its SYN an
//!   MSS that marks it as shimmed (the largest below its path's that leaves [`MARK_RESIDUE`]
//!   modulo [`MARK_MODULUS`]; a plain server just sends smaller segments). `connect()` returns
//!   when the TCP connection is established, as ever; the engine relays the app's bytes over TCP
//!   meanwhile and, once the backend connected back, sends CLAIM with a fresh secret.
//! - The backend ([`accept`]): a connection no HELLO registered, whose client offered a marked
//!   MSS, is swapped before `accept()` returns, as any upgraded one; its engine connects back to
//!   C:c with a HELLO flagged [`negotiation::HELLO_BACK`] naming C:c, relays meanwhile, and on
//!   CLAIM writes the secret on its TCP connection (the proof) and sends CONFIRM.
//!
//! The side that made the RDMA connection proves, as before: the client's listener takes
//! anyone who names C:c, so the client binds the stream only once the secret it sent came back
//! on its own TCP connection, which only the process that accepted that connection can write
//! into. A peer that races the backend to the listener at most costs the connection its
//! upgrade. What neither side gets in time (no connection back: a plain backend, or a plain
//! client whose MSS happened to look marked; no CLAIM) leaves both relayed over TCP, counted
//! `PEER_NOT_SHIMMED`, and the virtual IP (client) or client address (backend) stays TCP at once
//! for a while (the negative cache).

use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use libc::c_int;
use rdma_streams_transport::engine::{
    Acceptor, Attach, Conn, ConnectRequest, Decision, Handshake, Request,
};

use super::client::{count_tcp, ensure_bound, plain};
use super::engine::engine;
use super::events::{count_bytes, on_back_event};
use super::swap::{swap, unswap};
use super::{NEGATIVE, key, negotiate_timeout, note, now};
use crate::decision;
use crate::fdtable;
use crate::log::{Level, log_at};
use crate::negotiation::{self, Hello, Message};
use crate::policy::canonical_ip;
use crate::reason::{Reason, Role};
use crate::sys;

/// A shimmed client's SYN offers an MSS of this residue modulo [`MARK_MODULUS`].
pub const MARK_RESIDUE: u32 = 37;
/// See [`MARK_RESIDUE`]: the MSS it offers is at most this much below its path's.
pub const MARK_MODULUS: u32 = 64;
/// What `TCP_MAXSEG` reads before a connect when the app set none (the kernel's default).
const UNSET_MSS: c_int = 536;
/// The largest MSS a socket may be given (`MAX_TCP_WINDOW`).
const MAX_MSS: u32 = 32767;
/// How much longer than the negotiation bound each side waits for the other: the backend's
/// `accept()`, its RDMA connect back, CLAIM, the proof and CONFIRM.
pub(super) const BACK_WAIT: Duration = Duration::from_secs(2);

/// Connections in a row to one virtual IP (from one client address, on the backend) that
/// ended before their stream came, after which the next ones stay TCP for a while: whether its
/// backends are plain or its connections that short, they would not move to a stream, and a
/// plain connection costs less than a relayed one.
pub const ENDED_FIRST_IN_A_ROW: u8 = 3;
/// Destinations [`decided`] keeps counts for (the oldest goes first).
const ENDED_FIRST_KEYS: usize = 64;

/// Counts per destination of [`ENDED_FIRST_IN_A_ROW`].
static ENDED_FIRST: std::sync::Mutex<Vec<(SocketAddr, u8)>> = std::sync::Mutex::new(Vec::new());

/// Notes how a connection through a Service to or from `key` (the virtual IP and port; the
/// client's address on the backend) was decided; true when the next ones to it stay TCP for a
/// while (the negative cache): its peer did not connect back or refused, or it is the
/// [`ENDED_FIRST_IN_A_ROW`]th in a row that ended before its stream came.
pub fn decided(key: SocketAddr, path: rdma_streams_transport::engine::StreamPath) -> bool {
    use rdma_streams_transport::engine::StreamPath;
    let mut counts = ENDED_FIRST
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let at = counts.iter().position(|(k, _)| *k == key);
    match path {
        StreamPath::Unmoved => {
            let n = match at {
                Some(i) => {
                    counts[i].1 = counts[i].1.saturating_add(1);
                    counts[i].1
                }
                None => {
                    if counts.len() >= ENDED_FIRST_KEYS {
                        counts.remove(0);
                    }
                    counts.push((key, 1));
                    1
                }
            };
            if n >= ENDED_FIRST_IN_A_ROW {
                counts.retain(|(k, _)| *k != key);
                return true;
            }
            false
        }
        StreamPath::Tcp | StreamPath::Unclaimed => {
            counts.retain(|(k, _)| *k != key);
            true
        }
        StreamPath::Rdma | StreamPath::Broken => {
            counts.retain(|(k, _)| *k != key);
            false
        }
    }
}

/// The MSS a shimmed client offers on a path of MTU `mtu` (IPv6: `v6`): the largest of the
/// marked residue at most the path's own MSS; None on a path too small to spare it.
pub fn marked_mss(mtu: u32, v6: bool) -> Option<u32> {
    let headers = if v6 { 60 } else { 40 };
    let natural = mtu.checked_sub(headers)?.min(MAX_MSS);
    let below = natural.checked_sub(MARK_RESIDUE)? / MARK_MODULUS;
    let mss = below * MARK_MODULUS + MARK_RESIDUE;
    (mss >= 1024).then_some(mss)
}

/// Whether a client's offered MSS (as [`sys::tcp_peer_mss`] reads it) marks it as shimmed.
pub fn is_marked(peer_mss: u32) -> bool {
    peer_mss % MARK_MODULUS == MARK_RESIDUE
}

/// The client's connect to `peer`, a Service's virtual IP and port (see the module docs).
/// Returns the kernel connect's result (errno is the real call's).
pub fn connect(
    fd: c_int,
    peer: SocketAddr,
    real: &mut dyn FnMut(c_int) -> (c_int, c_int),
) -> c_int {
    if super::FORKED.load(std::sync::atomic::Ordering::Acquire) {
        // A fork child: its ancestor's engine expects the connection back for it.
        return super::delegate::connect(fd, peer, real);
    }
    if NEGATIVE.check(peer, now()).is_some() {
        return plain(fd, peer, Reason::NegativeCache, real);
    }
    let Some(client) = ensure_bound(fd, peer) else {
        return plain(fd, peer, Reason::Unsupported, real);
    };
    let conn = match expect(fd, client, peer) {
        Ok(conn) => conn,
        Err(reason) => return plain(fd, peer, reason, real),
    };
    let before = fdtable::get(fd);
    let s = match swap(fd) {
        Ok(s) => s,
        Err(e) => {
            log_at!(Level::Info, "client fd {fd}: swap failed ({e}): plain TCP");
            conn.abort();
            let _ = sys::set_tcp_maxseg(fd, 0);
            return plain(fd, peer, Reason::RdmaError, real);
        }
    };
    let tcp = s.kept.as_raw_fd();
    // Back to the TCP socket, unmarked, the listener closed.
    let give_up = |s| {
        conn.abort();
        if let Err(e) = unswap(fd, s, before) {
            log_at!(Level::Info, "client fd {fd}: undoing the swap failed ({e})");
        }
        let _ = sys::set_tcp_maxseg(fd, 0);
    };
    let (rc, err) = real(tcp);
    if rc != 0 && err != libc::EINPROGRESS {
        give_up(s);
        sys::set_errno(err);
        return rc;
    }
    let bound = negotiate_timeout();
    if rc != 0 {
        match sys::wait_established(tcp, bound) {
            sys::Established::Yes => {}
            sys::Established::Failed => {
                give_up(s);
                sys::set_errno(err);
                return rc;
            }
            sys::Established::Pending => {
                give_up(s);
                let _ = NEGATIVE.insert(peer, Reason::Timeout, now());
                count_tcp(fd, peer, Reason::Timeout);
                sys::set_errno(err);
                return rc;
            }
        }
    }
    super::set_direct(fd, &conn);
    conn.attach(
        s.local,
        Attach {
            kept: Some(s.kept),
            handshake: Handshake::Claim,
            on_event: on_back_event(Role::Client, fd, Some(peer), s.broken, peer),
            on_bytes: Some(count_bytes),
            claim_by: Some(now() + bound + BACK_WAIT),
            give_back: None,
        },
    );
    sys::set_errno(err);
    rc
}

/// A backend's connection back to a client that came through a Service, made and not yet
/// attached ([`connect_back`]).
pub(super) struct Back {
    /// The RDMA connection back (the connecting side of the binding, [`Handshake::Confirm`]).
    pub conn: Conn,
    /// The negative cache's key should it stay TCP: the client's address.
    pub cache: SocketAddr,
    /// Until when the attach waits for the client's CLAIM.
    pub claim_by: Instant,
}

/// The client's side before its kernel connect (see the module docs): TCP socket `tcp`, bound
/// to `client`, connecting to `peer`, a Service's virtual IP and port. Listens for the
/// connection back at `client` and marks the socket's MSS; the connection, to be attached once
/// the TCP connection is established, or the reason it stays TCP.
pub(super) fn expect(tcp: c_int, client: SocketAddr, peer: SocketAddr) -> Result<Conn, Reason> {
    // An app that chose its own MSS keeps it: its SYN cannot carry the mark.
    if sys::tcp_maxseg(tcp) != Some(UNSET_MSS) {
        return Err(Reason::ServiceIp);
    }
    let mss = sys::path_mtu(peer)
        .and_then(|m| marked_mss(m, peer.is_ipv6()))
        .ok_or(Reason::ServiceIp)?;
    let engine = engine().ok_or(Reason::RdmaError)?;
    let listen = SocketAddr::new(canonical_ip(client.ip()), client.port());
    let acceptor = Arc::new(BackAcceptor {
        client,
        port: peer.port(),
    });
    let conn = engine.expect(listen, acceptor).map_err(|e| {
        note(peer, &format!("no RDMA listener on {listen}: {e}"));
        Reason::RdmaError
    })?;
    let mark = c_int::try_from(mss).unwrap_or(UNSET_MSS);
    if sys::set_tcp_maxseg(tcp, mark).is_err() {
        conn.abort();
        return Err(Reason::Unsupported);
    }
    Ok(conn)
}

/// The backend's side (see the module docs) for a connection accepted on TCP socket `tcp`
/// from `peer` that no HELLO registered: the connection back, when the client's SYN was
/// marked, it did not just stay TCP, and the policy allows it; None: it stays TCP untouched.
pub(super) fn connect_back(tcp: c_int, peer: SocketAddr) -> Option<Back> {
    if !sys::tcp_peer_mss(tcp).is_some_and(is_marked) {
        return None;
    }
    let cache = SocketAddr::new(canonical_ip(peer.ip()), 0);
    if NEGATIVE.check(cache, now()).is_some() {
        return None;
    }
    let local = sys::local_addr(tcp)?;
    if !decision::policy().is_some_and(|p| p.server_allows(local.port(), peer.ip())) {
        return None;
    }
    let engine = engine()?;
    let bound = negotiate_timeout();
    let conn = engine.connect(ConnectRequest {
        dst: SocketAddr::new(canonical_ip(peer.ip()), peer.port()),
        src: Some(SocketAddr::new(canonical_ip(local.ip()), 0)),
        payload: Message::Hello(Hello {
            flags: negotiation::HELLO_BACK,
            nonce: negotiation::new_nonce(),
            client: peer,
        })
        .encode(),
        resolve_timeout: bound,
        handshake: Handshake::Confirm,
        unattached_timeout: None,
        reuse_wait: None,
    });
    log_at!(Level::Debug, "connecting back to {peer} for {local}");
    Some(Back {
        conn,
        cache,
        claim_by: now() + bound + BACK_WAIT,
    })
}

/// [`connect_back`] for a connection accepted on `fd` in this process (a fork child's goes to
/// its ancestor, [`super::server::claim_and_swap`]): true when it was swapped (the engine
/// connects back and relays meanwhile); false when it stays TCP untouched, for the caller to
/// count.
pub fn accept(fd: c_int, peer: SocketAddr) -> bool {
    let Some(back) = connect_back(fd, peer) else {
        return false;
    };
    let s = match swap(fd) {
        Ok(s) => s,
        Err(e) => {
            log_at!(Level::Info, "server fd {fd}: swap failed ({e}): plain TCP");
            back.conn.abort();
            return false;
        }
    };
    super::set_direct(fd, &back.conn);
    back.conn.attach(
        s.local,
        Attach {
            kept: Some(s.kept),
            handshake: Handshake::Confirm,
            on_event: on_back_event(Role::Server, fd, Some(peer), s.broken, back.cache),
            on_bytes: Some(count_bytes),
            claim_by: Some(back.claim_by),
            give_back: None,
        },
    );
    true
}

/// The client's listener for its connection back: one HELLO flagged back, naming the client's
/// own TCP address, from a backend the policy allows (its address with the Service's port).
struct BackAcceptor {
    client: SocketAddr,
    port: u16,
}

impl Acceptor for BackAcceptor {
    fn on_request(&self, request: Request<'_>) -> Decision {
        let verdict = match Message::decode(request.payload) {
            Ok(Message::Hello(h))
                if h.flags & negotiation::HELLO_BACK != 0 && key(h.client) == key(self.client) =>
            {
                let allowed = request.peer.is_some_and(|p| {
                    decision::policy()
                        .is_some_and(|pol| pol.client_allows(SocketAddr::new(p.ip(), self.port)))
                });
                if allowed {
                    Ok(h.nonce)
                } else {
                    Err(Message::refuse(h.nonce, Reason::Policy))
                }
            }
            Ok(Message::Hello(h)) => Err(Message::refuse(h.nonce, Reason::PeerRefused)),
            _ => Err(Message::refuse(0, Reason::PeerRefused)),
        };
        match verdict {
            Ok(nonce) => {
                log_at!(
                    Level::Debug,
                    "{:?} connected back for {}",
                    request.peer,
                    self.client
                );
                Decision::Accept(Message::Accept { nonce }.encode())
            }
            Err(refuse) => {
                log_at!(
                    Level::Debug,
                    "refused a connect back from {:?} for {}: {refuse:?}",
                    request.peer,
                    self.client
                );
                Decision::Reject(refuse.encode())
            }
        }
    }

    fn handshake(&self) -> Handshake {
        Handshake::Claim
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_marked_mss_is_the_largest_of_its_residue_below_the_paths() {
        assert_eq!(marked_mss(1500, false), Some(1445));
        assert_eq!(marked_mss(1500, true), Some(1381));
        assert_eq!(marked_mss(9000, false), Some(8933));
        // Loopback's 65536: the largest MSS a socket may be given bounds it.
        assert_eq!(marked_mss(65536, false), Some(32741));
        assert_eq!(
            marked_mss(1000, false),
            None,
            "too small a path to spare it"
        );
        assert_eq!(marked_mss(20, false), None);
        for mtu in [1280, 1400, 1450, 1500, 2044, 4092, 9000, 9001, 65520] {
            for v6 in [false, true] {
                let Some(mss) = marked_mss(mtu, v6) else {
                    continue;
                };
                assert!(is_marked(mss), "{mtu}");
                let natural = mtu - if v6 { 60 } else { 40 };
                assert!(mss <= natural && natural.min(MAX_MSS) - mss < MARK_MODULUS);
            }
        }
    }

    /// The MSS plain stacks offer on common paths (Ethernet, jumbo frames, VXLAN and IPIP
    /// overlays, PPPoE, IPoIB, loopback, the kernel's default), with and without timestamps
    /// (as the server reads them), never look marked.
    #[test]
    fn common_plain_mss_values_are_not_marked() {
        for mss in [
            536, 1360, 1380, 1400, 1410, 1420, 1430, 1440, 1448, 1450, 1452, 1460, 2004, 4052,
            8910, 8948, 8960, 8961, 32768, 65480, 65483,
        ] {
            assert!(!is_marked(mss), "{mss}");
        }
    }

    #[test]
    fn connections_that_end_first_in_a_row_keep_the_next_ones_on_tcp() {
        use rdma_streams_transport::engine::StreamPath;
        let vip: SocketAddr = "10.96.0.10:80".parse().unwrap();
        let other: SocketAddr = "10.96.0.11:80".parse().unwrap();
        for _ in 1..ENDED_FIRST_IN_A_ROW {
            assert!(!decided(vip, StreamPath::Unmoved));
        }
        assert!(!decided(other, StreamPath::Unmoved), "counted apart");
        assert!(decided(vip, StreamPath::Unmoved), "the last in a row");
        assert!(
            !decided(vip, StreamPath::Unmoved),
            "counted from zero again"
        );
        assert!(!decided(vip, StreamPath::Rdma));
        for _ in 1..ENDED_FIRST_IN_A_ROW {
            assert!(
                !decided(vip, StreamPath::Unmoved),
                "an upgrade ends the row"
            );
        }
        assert!(decided(vip, StreamPath::Unclaimed), "no connection back");
        assert!(decided(vip, StreamPath::Tcp));
    }

    /// On a real TCP connection over loopback: a client socket given the marked MSS before its
    /// connect is seen marked by the accepting side, an unmarked one is not.
    #[test]
    fn the_accepting_side_reads_the_clients_mark() {
        use std::net::{TcpListener, TcpStream};
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        for marked in [true, false] {
            let socket = sys::tcp_socket(false).unwrap();
            let fd = socket.as_raw_fd();
            assert_eq!(sys::tcp_maxseg(fd), Some(UNSET_MSS));
            if marked {
                let mss = marked_mss(sys::path_mtu(addr).unwrap(), false).unwrap();
                sys::set_tcp_maxseg(fd, c_int::try_from(mss).unwrap()).unwrap();
            }
            assert_eq!(sys::connect_for_test(fd, addr).0, 0);
            let client = TcpStream::from(socket);
            let (accepted, _) = listener.accept().unwrap();
            let seen = sys::tcp_peer_mss(accepted.as_raw_fd()).unwrap();
            assert_eq!(is_marked(seen), marked, "{seen}");
            drop((client, accepted));
        }
    }
}
