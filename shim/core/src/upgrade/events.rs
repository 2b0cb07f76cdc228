//! Counting a connection once it is decided, and its bytes when it ends (the engine reports
//! both, from its thread).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use libc::c_int;
use rdma_streams_transport::engine::{Carried, Event, StreamPath};

use crate::log::{Level, log_at};
use crate::reason::{Path, Reason, Role};
use crate::stats::Stats;

/// Counts one connection and logs it (one debug line per connection).
pub fn record(role: Role, fd: c_int, peer: Option<SocketAddr>, path: Path, reason: Reason) {
    Stats::global().record(role, path, reason);
    match peer {
        Some(p) => log_at!(Level::Debug, "{role} fd {fd} peer {p}: {path} {reason}"),
        None => log_at!(Level::Debug, "{role} fd {fd} peer ?: {path} {reason}"),
    }
}

/// The path and reason a decided stream is counted with. A server whose client did not CONFIRM
/// relays over TCP because the client gave up (`TIMEOUT`), and so does a client whose CLAIM did
/// not come (the server accepted late, or in another process); a client whose stream died
/// before it was attached relays too (`RDMA_ERROR`). A connection that ended on TCP before its
/// move was never anything else (`ENDED_FIRST`).
pub fn decided(role: Role, path: StreamPath) -> (Path, Reason) {
    match (path, role) {
        (StreamPath::Rdma, _) => (Path::Rdma, Reason::Upgraded),
        (StreamPath::Tcp, Role::Server) | (StreamPath::Unclaimed, _) => {
            (Path::Tcp, Reason::Timeout)
        }
        (StreamPath::Tcp, Role::Client) | (StreamPath::Broken, _) => (Path::Tcp, Reason::RdmaError),
        (StreamPath::Unmoved, _) => (Path::Tcp, Reason::EndedFirst),
    }
}

/// The path and reason of a connection upgraded through a Service's virtual IP ([`super::back`]):
/// one that stays on TCP does because its peer did not make the connection back (a plain
/// peer, or one whose shim could not), or refused it.
pub fn decided_back(path: StreamPath) -> (Path, Reason) {
    match path {
        StreamPath::Rdma => (Path::Rdma, Reason::Upgraded),
        StreamPath::Tcp | StreamPath::Unclaimed => (Path::Tcp, Reason::PeerNotShimmed),
        StreamPath::Broken => (Path::Tcp, Reason::RdmaError),
        StreamPath::Unmoved => (Path::Tcp, Reason::EndedFirst),
    }
}

/// Counts the bytes a connection with a stream moved, by their path (as they move: a process
/// may exit before its streams end).
pub fn count_bytes(carried: Carried, sent: u64, received: u64) {
    let stats = Stats::global();
    match carried {
        Carried::Stream => {
            stats.add_rdma_bytes_sent(sent);
            stats.add_rdma_bytes_received(received);
        }
        Carried::BeforeMove => stats.add_before_move(sent, received),
    }
}

/// The engine's callback for one swapped connection. An end in a reset (a failure before the
/// peer's FIN, [`End::reset`], reported before the engine ends the app's side) is made the
/// app's end's own error ([`super::queue_reset`]), or else sets `broken` for the hooks, so the
/// app's reads tell it from an orderly end.
///
/// [`End::reset`]: rdma_streams_transport::engine::End::reset
pub fn on_event(
    role: Role,
    fd: c_int,
    peer: Option<SocketAddr>,
    broken: Arc<AtomicBool>,
) -> Box<dyn FnMut(Event) + Send> {
    on_event_as(role, fd, peer, broken, None)
}

/// [`on_event`] for a connection upgraded through a Service ([`super::back`], [`decided_back`]):
/// one that stays TCP puts `cache` (the virtual IP and port; the client's IP on the server)
/// in the negative cache.
pub fn on_back_event(
    role: Role,
    fd: c_int,
    peer: Option<SocketAddr>,
    broken: Arc<AtomicBool>,
    cache: SocketAddr,
) -> Box<dyn FnMut(Event) + Send> {
    on_event_as(role, fd, peer, broken, Some(cache))
}

fn on_event_as(
    role: Role,
    fd: c_int,
    peer: Option<SocketAddr>,
    broken: Arc<AtomicBool>,
    back: Option<SocketAddr>,
) -> Box<dyn FnMut(Event) + Send> {
    Box::new(move |event| match event {
        Event::Decided(decision) => {
            let (path, reason) = match back {
                Some(_) => decided_back(decision),
                None => decided(role, decision),
            };
            let cache = match back {
                Some(key) => super::back::decided(key, decision).then_some(key),
                None => peer.filter(|_| decision == StreamPath::Unclaimed),
            };
            if let Some(key) = cache {
                // As for a connect that waited for its CLAIM in vain: the next ones to this
                // peer stay TCP at once for a while.
                let _ = super::NEGATIVE.insert(key, reason, super::now());
            }
            record(role, fd, peer, path, reason);
        }
        Event::Ended(end) => {
            // The kernel reports the reset on the app's end when the byte is queued; the
            // hooks do when it cannot be.
            let untold = end.reset && !super::queue_reset(&broken);
            if untold {
                broken.store(true, Ordering::Release);
                super::mark_broken(&broken);
            }
            // Processes the app handed its end to hear it from the engine's process.
            super::handed::ended(&broken, untold);
            if end.path == StreamPath::Rdma {
                Stats::global().record_rdma_close(end.error.is_some());
            }
            match &end.error {
                None => log_at!(
                    Level::Debug,
                    "{role} fd {fd}: ended ({:?}): {} bytes out, {} in",
                    end.path,
                    end.sent,
                    end.received
                ),
                Some(e) => log_at!(
                    Level::Info,
                    "{role} fd {fd}: ended ({:?}) after {} bytes out, {} in: {e}",
                    end.path,
                    end.sent,
                    end.received
                ),
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decided_paths_map_to_reasons() {
        assert_eq!(
            decided(Role::Client, StreamPath::Rdma),
            (Path::Rdma, Reason::Upgraded)
        );
        assert_eq!(
            decided(Role::Server, StreamPath::Tcp),
            (Path::Tcp, Reason::Timeout)
        );
        assert_eq!(
            decided(Role::Client, StreamPath::Tcp),
            (Path::Tcp, Reason::RdmaError)
        );
        assert_eq!(
            decided(Role::Client, StreamPath::Unclaimed),
            (Path::Tcp, Reason::Timeout)
        );
        assert_eq!(
            decided(Role::Server, StreamPath::Broken),
            (Path::Tcp, Reason::RdmaError)
        );
    }
}
