//! The source side of a stream: connect to the peer gateway with the destination and the
//! migration in the connect request, and wait for its answer, which comes after the peer
//! dialed the destination. Blocking (the wait); run on a blocking thread.
//!
//! Nothing is read from the captured connection before the stream is established, so every
//! failure up to there leaves the caller free to relay that same connection over TCP, counted
//! with the [`Fallback`] reason [`classify`] gives.

use std::{
    net::{IpAddr, SocketAddr},
    time::{Duration, Instant},
};

use rdma_streams_common::report::Report;
use rdma_streams_transport::{Conn, ConnectError, ConnectRequest, Engine, Handshake, RejectedBy};
use tracing::debug;

use super::{
    fallback::Fallback,
    payload::{Answer, Open},
};

/// Opens a stream to the gateway at `peer` for `open` within `timeout`, from `source` (the
/// gateway's own RDMA address, when it listens on one), or says why not.
pub fn open_stream(
    engine: &Engine,
    peer: SocketAddr,
    source: Option<IpAddr>,
    open: &Open,
    timeout: Duration,
) -> Result<Conn, Fallback> {
    let deadline = Instant::now() + timeout;
    let conn = engine.connect(ConnectRequest {
        dst: peer,
        src: source
            .filter(|ip| ip.is_ipv4() == peer.is_ipv4())
            .map(|ip| SocketAddr::new(ip, 0)),
        payload: open.encode(),
        resolve_timeout: timeout,
        handshake: Handshake::Open,
    });
    let answer = conn.wait_established(deadline).map_err(|error| {
        // A connect still under way (the timeout) must not go on; any other error already
        // ended it, and an abort of it changes nothing.
        conn.abort();
        debug!(error = %Report(&error), %peer, "stream not established");
        classify(&error)
    })?;
    match Answer::decode(&answer) {
        Ok(Answer::Ok) => Ok(conn),
        other => {
            conn.abort();
            debug!(?other, %peer, "the peer accepted with an answer that is not a gateway's");
            Err(Fallback::RdmaError)
        }
    }
}

/// Maps a connect failure to a fallback reason.
pub fn classify(error: &ConnectError) -> Fallback {
    match error {
        // The peer gateway said no (unknown migration, destination unreachable, not a
        // gateway's request), its engine did (pinned memory, resources, no decision in
        // time), or nothing of ours listens there (the CM's own reject, another program).
        ConnectError::Rejected(
            RejectedBy::App(_) | RejectedBy::Transport(_) | RejectedBy::Foreign { .. },
        ) => Fallback::PeerRefused,
        ConnectError::Timeout => Fallback::Timeout,
        ConnectError::Unreachable { status, .. } => match status.saturating_abs() {
            libc::ETIMEDOUT => Fallback::Timeout,
            // No RDMA device on the route to the peer.
            libc::ENODEV | libc::EADDRNOTAVAIL => Fallback::NoDevice,
            // The CM found no one, or no route: nothing of ours listens there.
            _ => Fallback::PeerRefused,
        },
        ConnectError::Iwarp => Fallback::NoDevice,
        _ => Fallback::RdmaError,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdma_streams_transport::wire::BadPrivateData;

    #[test]
    fn connect_failures_map_to_the_reasons_users_know() {
        let cases = [
            (
                ConnectError::Rejected(RejectedBy::App(Answer::UnknownMigration.encode())),
                Fallback::PeerRefused,
            ),
            (
                ConnectError::Rejected(RejectedBy::App(b"S\x03".to_vec())),
                Fallback::PeerRefused,
            ),
            (
                ConnectError::Rejected(RejectedBy::Transport(1)),
                Fallback::PeerRefused,
            ),
            (
                ConnectError::Rejected(RejectedBy::Foreign { status: 28 }),
                Fallback::PeerRefused,
            ),
            (ConnectError::Timeout, Fallback::Timeout),
            (
                ConnectError::Unreachable {
                    what: "connect (unreachable)",
                    status: -110,
                },
                Fallback::Timeout,
            ),
            (
                ConnectError::Unreachable {
                    what: "address resolution",
                    status: -19,
                },
                Fallback::NoDevice,
            ),
            (
                ConnectError::Unreachable {
                    what: "route resolution",
                    status: -113,
                },
                Fallback::PeerRefused,
            ),
            (ConnectError::Iwarp, Fallback::NoDevice),
            (ConnectError::Memlock, Fallback::RdmaError),
            (
                ConnectError::NotOurPeer(BadPrivateData::Magic),
                Fallback::RdmaError,
            ),
            (
                ConnectError::Local {
                    what: "rdma_connect",
                    error: "EINVAL".into(),
                },
                Fallback::RdmaError,
            ),
            (ConnectError::Closed, Fallback::RdmaError),
            (ConnectError::EngineGone, Fallback::RdmaError),
        ];
        for (error, want) in cases {
            assert_eq!(classify(&error), want, "{error:?}");
        }
    }
}
