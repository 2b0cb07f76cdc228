//! The client side of `connect()` for a capable process whose policy allows the peer.
//!
//! 1. The negative cache: a destination that failed within 60 s stays TCP at once.
//! 2. The socket is bound to the route's source address (port 0: the kernel picks it now) if
//!    the app did not bind it, so the 4-tuple is known before any packet leaves.
//! 3. RDMA connect to the peer's IP and the app's port, HELLO{nonce, C:c} in the request,
//!    within N (`STREAMSHIM_NEGOTIATE_MS`). Established means the server's engine registered
//!    C:c; a reject, no listener, no RDMA path or no answer in time: plain TCP. An unbound
//!    socket to a peer with a spare ([`spare`]) takes it instead: it is bound to the address
//!    the spare's HELLO named, and the spare's RDMA connect, made ahead, is only awaited.
//! 4. The swap ([`swap`]): the app's fd number moves to a socketpair end and its TCP socket to
//!    a kept number *before* the kernel connect, so that no app thread can pick up the TCP
//!    socket after the peer can accept it (a thread of this process that waits on the fd once
//!    the server's `accept()` returned waits on the socketpair, where the stream's bytes and
//!    EOF come).
//! 5. The kernel connect of the kept socket (a non-blocking one: its handshake is awaited,
//!    within N). `connect()` returns when the TCP connection is established, as without the
//!    shim: the engine takes the connection ([`Attach::claim_by`]) and waits for the accepting
//!    process's CLAIM beside it, the app's bytes held in the socketpair meanwhile, until one
//!    deadline N from the kernel connect. CLAIM: its secret goes out as the first bytes of the
//!    TCP connection (the proof that binds the stream to this connection), then CONFIRM.
//!    Nothing by then (the app accepts late, or another process accepted), or the server's app
//!    speaking TCP first: no proof, no CONFIRM, and the engine relays the socketpair over the
//!    TCP socket (`TIMEOUT`; the server, without the proof and CONFIRM, stays on TCP). A
//!    kernel connect that fails or does not complete puts the TCP socket back on the app's
//!    number ([`unswap`]).

use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsRawFd;
use std::time::Duration;

use libc::c_int;
use rdma_streams_transport::engine::{
    Attach, Conn, ConnectError, ConnectRequest, Handshake, RejectedBy,
};
use rdma_streams_transport::route;
use rdma_streams_transport::wire::TransportReject;

use super::engine::engine;
use super::events::{count_bytes, on_event, record};
use super::spare;
use super::swap::{Swapped, swap, unswap};
use super::{NEGATIVE, negotiate_timeout, note, now};
use crate::fdtable::{self, COUNTED};
use crate::log::{Level, log_at};
use crate::negotiation::{self, Hello, Message};
use crate::policy::canonical_ip;
use crate::reason::{Path, Reason, Role};
use crate::sys;

/// The fallback reason for a connect that did not establish. `PEER_NOT_SHIMMED`: nothing of
/// ours answers there (no listener, another RDMA program, no RDMA path); `PEER_REFUSED`: the
/// peer's shim or engine said no; `TIMEOUT`: no answer within the bound, the address or route
/// resolution's own timeout included (it is given the same bound, so which of the two ends
/// first is a race: an address nobody answers for, a Service's virtual IP, counts the same
/// either way).
pub fn reason_for(error: &ConnectError) -> Reason {
    match error {
        ConnectError::Unreachable { status, .. }
            if status.unsigned_abs() == libc::ETIMEDOUT.unsigned_abs() =>
        {
            Reason::Timeout
        }
        ConnectError::Rejected(RejectedBy::App(payload)) => match Message::decode(payload) {
            Ok(Message::Refuse { .. }) => Reason::PeerRefused,
            _ => Reason::PeerNotShimmed,
        },
        ConnectError::Rejected(RejectedBy::Transport(code)) => {
            match TransportReject::from_code(*code) {
                Some(TransportReject::NoListener | TransportReject::BadRequest) => {
                    Reason::PeerNotShimmed
                }
                _ => Reason::PeerRefused,
            }
        }
        ConnectError::Rejected(RejectedBy::Foreign { .. })
        | ConnectError::Unreachable { .. }
        | ConnectError::NotOurPeer(_) => Reason::PeerNotShimmed,
        ConnectError::Memlock => Reason::Memlock,
        ConnectError::Iwarp => Reason::Iwarp,
        ConnectError::Timeout => Reason::Timeout,
        _ => Reason::RdmaError,
    }
}

/// Reasons about this process or socket, not about the peer: never put in the negative cache.
fn local_reason(reason: Reason) -> bool {
    matches!(
        reason,
        Reason::NegativeCache
            | Reason::Unsupported
            | Reason::Memlock
            | Reason::RdmaError
            | Reason::ServiceIp
    )
}

/// Connects over TCP without the stream and counts the connection with `reason`.
pub(super) fn plain(
    fd: c_int,
    peer: SocketAddr,
    reason: Reason,
    real: &mut dyn FnMut(c_int) -> (c_int, c_int),
) -> c_int {
    if !local_reason(reason) {
        let _ = NEGATIVE.insert(peer, reason, now());
    }
    let (rc, err) = real(fd);
    if rc == 0 || err == libc::EINPROGRESS {
        count_tcp(fd, peer, reason);
    }
    rc
}

/// Counts the connection on `fd` (client role) as staying TCP with `reason`, once.
pub(super) fn count_tcp(fd: c_int, peer: SocketAddr, reason: Reason) {
    if fdtable::add(fd, COUNTED) & COUNTED == 0 {
        record(Role::Client, fd, Some(peer), Path::Tcp, reason);
    }
}

/// See the module docs. Returns the kernel connect's result (errno is the real call's).
/// `real(n)` makes the app's connect call on number `n` (the app's fd, or the kept copy of
/// its socket).
pub fn connect(
    fd: c_int,
    peer: SocketAddr,
    real: &mut dyn FnMut(c_int) -> (c_int, c_int),
) -> c_int {
    if super::FORKED.load(std::sync::atomic::Ordering::Acquire) {
        // A fork child: the ancestor whose engine it shares the claim channel with connects.
        return super::delegate::connect(fd, peer, real);
    }
    if NEGATIVE.check(peer, now()).is_some() {
        return plain(fd, peer, Reason::NegativeCache, real);
    }
    let bound = negotiate_timeout();
    let mut took = None;
    let (client, conn) = match spare::take(fd, peer) {
        // The RDMA connect was made ahead ([`spare`]): only its answer is awaited.
        Some(taken) => match finish_stream(peer, &taken.conn, taken.nonce, bound) {
            Ok(()) => {
                took = Some(taken.age);
                (taken.client, taken.conn)
            }
            Err(reason) => return plain(fd, peer, reason, real),
        },
        None => {
            let Some(client) = ensure_bound(fd, peer) else {
                return plain(fd, peer, Reason::Unsupported, real);
            };
            match open_stream(peer, client, bound) {
                Ok(conn) => (client, conn),
                Err(reason) => return plain(fd, peer, reason, real),
            }
        }
    };
    let (rc, err) = upgrade(fd, peer, &conn, bound, real);
    if fdtable::get(fd) & fdtable::SWAPPED != 0 {
        // Upgraded: the next connection to the peer finds its RDMA connect made.
        spare::upgraded(fd, peer, client, took);
    }
    // What the kernel connect answered, whatever the shim's own calls after it left in errno.
    sys::set_errno(err);
    rc
}

/// Steps 4 and 5 for the established `conn`: the kernel connect's (result, errno).
fn upgrade(
    fd: c_int,
    peer: SocketAddr,
    conn: &Conn,
    bound: Duration,
    real: &mut dyn FnMut(c_int) -> (c_int, c_int),
) -> (c_int, c_int) {
    let before = fdtable::get(fd);
    let s = match swap(fd) {
        Ok(s) => s,
        Err(e) => {
            // Nothing reached the TCP socket yet: it stays a plain one.
            log_at!(Level::Info, "client fd {fd}: swap failed ({e}): plain TCP");
            conn.abort();
            let rc = plain(fd, peer, Reason::RdmaError, real);
            return (rc, sys::errno());
        }
    };
    let tcp = s.kept.as_raw_fd();
    // Back to the TCP socket, the stream aborted (the server, without the proof and CONFIRM,
    // stays on TCP): what the app's number names when the connection does not upgrade.
    let give_up = |s: Swapped| {
        conn.abort();
        if let Err(e) = unswap(fd, s, before) {
            log_at!(Level::Info, "client fd {fd}: undoing the swap failed ({e})");
        }
    };
    let (rc, err) = real(tcp);
    if rc != 0 && err != libc::EINPROGRESS {
        // The kernel connect failed: the app sees exactly that error; not counted.
        give_up(s);
        return (rc, err);
    }
    let deadline = now() + bound;
    if rc != 0 {
        match sys::wait_established(tcp, bound) {
            sys::Established::Yes => {}
            sys::Established::Failed => {
                // The failure stays pending for the app's SO_ERROR; a failed connect is not
                // counted.
                give_up(s);
                return (rc, err);
            }
            sys::Established::Pending => {
                give_up(s);
                let _ = NEGATIVE.insert(peer, Reason::Timeout, now());
                count_tcp(fd, peer, Reason::Timeout);
                return (rc, err);
            }
        }
    }
    // The TCP connection is up: `connect()` returns as it would without the shim. The engine
    // waits for CLAIM beside it and writes the proof when it comes; without it by the deadline
    // it relays over TCP (counted `TIMEOUT` then, [`super::events`]).
    super::set_direct(fd, conn);
    conn.attach(
        s.local,
        Attach {
            kept: Some(s.kept),
            handshake: Handshake::Confirm,
            on_event: on_event(Role::Client, fd, Some(peer), s.broken),
            on_bytes: Some(count_bytes),
            claim_by: Some(deadline),
            give_back: None,
        },
    );
    (rc, err)
}

/// Step 3: the RDMA connect from `client` (the app socket's bound address) to `peer`'s IP
/// and port with HELLO, established with our ACCEPT within `bound`; else the fallback reason.
pub(super) fn open_stream(
    peer: SocketAddr,
    client: SocketAddr,
    bound: Duration,
) -> Result<Conn, Reason> {
    let Some(engine) = engine() else {
        return Err(Reason::RdmaError);
    };
    let nonce = negotiation::new_nonce();
    let dst = SocketAddr::new(canonical_ip(peer.ip()), peer.port());
    let conn = engine.connect(ConnectRequest {
        dst,
        src: Some(SocketAddr::new(canonical_ip(client.ip()), 0)),
        payload: Message::Hello(Hello {
            flags: 0,
            nonce,
            client,
        })
        .encode(),
        resolve_timeout: bound,
        handshake: Handshake::Confirm,
        unattached_timeout: None,
        reuse_wait: None,
    });
    finish_stream(peer, &conn, nonce, bound)?;
    Ok(conn)
}

/// The end of step 3 for `conn`, whose HELLO carried `nonce`: established with our ACCEPT
/// within `bound`, else the fallback reason (the connection aborted).
fn finish_stream(peer: SocketAddr, conn: &Conn, nonce: u64, bound: Duration) -> Result<(), Reason> {
    match conn.wait_established(now() + bound) {
        Ok(payload) => match Message::decode(&payload) {
            Ok(Message::Accept { nonce: n }) if n == nonce => Ok(()),
            other => {
                note(peer, &format!("unexpected answer {other:?}"));
                conn.abort();
                Err(Reason::PeerNotShimmed)
            }
        },
        Err(e) => {
            if e == ConnectError::Timeout {
                conn.abort();
            }
            note(peer, &e.to_string());
            Err(reason_for(&e))
        }
    }
}

/// The client's TCP address as the server will see it, binding the app's socket to the
/// route's source address (port 0: the kernel picks the port now) if the app did not bind it.
pub(super) fn ensure_bound(fd: c_int, peer: SocketAddr) -> Option<SocketAddr> {
    let local = sys::local_addr(fd)?;
    if local.port() != 0 && !local.ip().is_unspecified() {
        return Some(local);
    }
    let src = route_source(peer, local)?;
    if local.port() != 0 {
        return Some(SocketAddr::new(src, local.port()));
    }
    sys::bind(fd, SocketAddr::new(src, 0)).ok()?;
    sys::local_addr(fd).filter(|a| a.port() != 0)
}

/// The source address the kernel would pick for `peer`, in the family of the app's socket
/// (`local`).
pub(super) fn route_source(peer: SocketAddr, local: SocketAddr) -> Option<IpAddr> {
    let ip = route::source_for(peer).ok()?;
    Some(match (local, ip) {
        // An AF_INET6 app socket reaching an IPv4 peer (v4-mapped): bind the mapped form.
        (SocketAddr::V6(_), IpAddr::V4(v4)) => IpAddr::V6(v4.to_ipv6_mapped()),
        (_, ip) => ip,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    #[test]
    fn connect_errors_map_to_reasons() {
        let refuse = Message::refuse(1, Reason::Policy).encode();
        let cases = [
            (
                ConnectError::Rejected(RejectedBy::App(refuse)),
                Reason::PeerRefused,
            ),
            (
                ConnectError::Rejected(RejectedBy::App(b"G?".to_vec())),
                Reason::PeerNotShimmed,
            ),
            (
                ConnectError::Rejected(RejectedBy::Transport(1)),
                Reason::PeerRefused,
            ),
            (
                ConnectError::Rejected(RejectedBy::Transport(5)),
                Reason::PeerNotShimmed,
            ),
            (
                ConnectError::Rejected(RejectedBy::Foreign { status: 8 }),
                Reason::PeerNotShimmed,
            ),
            (
                ConnectError::Unreachable {
                    what: "address resolution",
                    status: -libc::ETIMEDOUT,
                },
                Reason::Timeout,
            ),
            (
                ConnectError::Unreachable {
                    what: "rdma_resolve_addr",
                    status: libc::ETIMEDOUT,
                },
                Reason::Timeout,
            ),
            (
                ConnectError::Unreachable {
                    what: "address resolution",
                    status: -libc::EHOSTUNREACH,
                },
                Reason::PeerNotShimmed,
            ),
            (ConnectError::Memlock, Reason::Memlock),
            (ConnectError::Iwarp, Reason::Iwarp),
            (ConnectError::Timeout, Reason::Timeout),
            (ConnectError::EngineGone, Reason::RdmaError),
        ];
        for (error, want) in cases {
            assert_eq!(reason_for(&error), want, "{error:?}");
        }
        assert!(local_reason(Reason::Memlock));
        assert!(
            local_reason(Reason::ServiceIp),
            "about this socket, not the Service"
        );
        assert!(!local_reason(Reason::PeerNotShimmed));
    }

    #[test]
    fn the_route_source_of_loopback_is_loopback() {
        let peer: SocketAddr = "127.0.0.1:9".parse().unwrap();
        let local: SocketAddr = "0.0.0.0:0".parse().unwrap();
        assert_eq!(
            route_source(peer, local),
            Some(IpAddr::V4(Ipv4Addr::LOCALHOST))
        );
        let local6: SocketAddr = "[::]:0".parse().unwrap();
        assert_eq!(
            route_source(peer, local6),
            Some(IpAddr::V6(Ipv4Addr::LOCALHOST.to_ipv6_mapped()))
        );
    }
}
