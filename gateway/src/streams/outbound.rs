//! The source side of a stream: authenticate to the peer gateway and open the stream in two
//! connect requests (`super::payload`): HELLO, answered by a challenge; PROOF, answered (after
//! the peer dialed the destination) by an accept whose tag this side verifies. Blocking (the
//! waits); run on a blocking thread.
//!
//! Nothing is read from the captured connection before the stream is established and its
//! accept verified, so every failure up to there leaves the caller free to relay that same
//! connection over TCP, counted with the [`Fallback`] reason given here.

use std::{
    io,
    net::{IpAddr, SocketAddr},
    time::{Duration, Instant},
};

use rdma_streams_common::report::Report;
use rdma_streams_transport::{Conn, ConnectError, ConnectRequest, Engine, Handshake, RejectedBy};
use tracing::debug;

use super::{
    fallback::Fallback,
    keys::PeerKeys,
    payload::{Answer, Hello, Open, Proof, UidDigest, ticket_of},
    transcript::{Label, Nonce, Transcript, random_nonce},
};

/// How long the source waits before it asks again when the peer does not know the migration
/// yet (its announcement may come after ours).
pub const UNKNOWN_RETRY: Duration = Duration::from_millis(100);

/// One connect request to the peer gateway.
pub trait Dial {
    type Conn;
    /// Sends a connect request carrying `payload`, waits until `deadline`; the connection and
    /// the accept's payload, or why not (a connection that failed is already ended).
    fn dial(
        &self,
        payload: Vec<u8>,
        deadline: Instant,
    ) -> Result<(Self::Conn, Vec<u8>), ConnectError>;
    /// Ends an established connection that will not be used.
    fn abort(&self, conn: &Self::Conn);
}

/// [`Dial`] on the transport's engine, from `source` to `peer`.
pub struct EngineDial<'a> {
    pub engine: &'a Engine,
    pub peer: SocketAddr,
    pub source: IpAddr,
}

impl Dial for EngineDial<'_> {
    type Conn = Conn;

    fn dial(&self, payload: Vec<u8>, deadline: Instant) -> Result<(Conn, Vec<u8>), ConnectError> {
        let conn = self.engine.connect(ConnectRequest {
            dst: self.peer,
            src: Some(SocketAddr::new(self.source, 0)),
            payload,
            resolve_timeout: deadline.saturating_duration_since(Instant::now()),
            handshake: Handshake::Open,
            unattached_timeout: None,
            reuse_wait: None,
        });
        match conn.wait_established(deadline) {
            Ok(answer) => Ok((conn, answer)),
            Err(error) => {
                // A connect still under way (the timeout) must not go on; any other error
                // already ended it, and an abort changes nothing.
                conn.abort();
                Err(error)
            }
        }
    }

    fn abort(&self, conn: &Conn) {
        conn.abort();
    }
}

/// What the source knows about the stream it opens.
#[derive(Debug, Clone, Copy)]
pub struct Opening {
    /// The captured connection's original destination.
    pub destination: SocketAddr,
    pub migration: UidDigest,
    /// This gateway's RDMA address (the connect requests' source).
    pub source_gateway: IpAddr,
    /// The peer gateway's RDMA address.
    pub target_gateway: IpAddr,
}

/// The address this gateway opens streams to `peer` from: `configured` (the `--listen`
/// address) when it is of the peer's family, else the kernel's choice for the route to the
/// peer (what the connection manager would pick), found with an unsent UDP connect.
pub fn source_address(peer: SocketAddr, configured: Option<IpAddr>) -> io::Result<IpAddr> {
    if let Some(ip) = configured.filter(|ip| ip.is_ipv4() == peer.is_ipv4()) {
        return Ok(ip);
    }
    rdma_streams_transport::route::source_for(peer)
}

/// Opens a stream to the gateway at `peer` for `opening.destination` within `timeout`, from
/// `source` (the gateway's own RDMA address when it listens on one), authenticated with
/// `keys`; or says why not.
pub fn open_stream(
    engine: &Engine,
    peer: SocketAddr,
    source: Option<IpAddr>,
    keys: &PeerKeys,
    destination: SocketAddr,
    migration: UidDigest,
    timeout: Duration,
) -> Result<Conn, Fallback> {
    let deadline = Instant::now() + timeout;
    if keys.is_empty() {
        return Err(Fallback::NoPeerKey);
    }
    let source = source_address(peer, source).map_err(|error| {
        debug!(error = %Report(&error), %peer, "no route to the peer gateway");
        Fallback::PeerRefused
    })?;
    let dial = EngineDial {
        engine,
        peer,
        source,
    };
    let opening = Opening {
        destination,
        migration,
        source_gateway: source,
        target_gateway: peer.ip(),
    };
    open(&dial, keys, &opening, deadline, random_nonce)
}

/// The reason of an answer the peer rejected a request with.
fn refused(answer: Result<Answer, impl std::fmt::Debug>) -> Fallback {
    match answer {
        Ok(Answer::AuthFailed) => Fallback::PeerAuthFailed,
        Ok(Answer::NoKey) => Fallback::NoPeerKey,
        // Unknown migration, unreachable or foreign destination, busy, an older gateway, or
        // an answer that is not a gateway's.
        _ => Fallback::PeerRefused,
    }
}

/// The two rounds over `dial`; see the module docs.
pub fn open<D: Dial>(
    dial: &D,
    keys: &PeerKeys,
    opening: &Opening,
    deadline: Instant,
    mut fresh: impl FnMut() -> Option<Nonce>,
) -> Result<D::Conn, Fallback> {
    let Some(key) = keys.signing() else {
        return Err(Fallback::NoPeerKey);
    };
    let port = opening.destination.port();
    let migration = opening.migration;
    // Round 1: HELLO, answered by a challenge (never accepted).
    let (source_nonce, target_nonce) = loop {
        let nonce = fresh().ok_or(Fallback::RdmaError)?;
        let hello = Open::Hello(Hello {
            port,
            migration,
            nonce,
        });
        match dial.dial(hello.encode(), deadline) {
            Ok((conn, _)) => {
                dial.abort(&conn);
                debug!("the peer accepted a HELLO: not a gateway of this version");
                return Err(Fallback::RdmaError);
            }
            Err(ConnectError::Rejected(RejectedBy::App(payload))) => {
                match Answer::decode(&payload) {
                    Ok(Answer::Challenge(target)) => break (nonce, target),
                    // The peer has not heard of the migration yet: ask again while the bound
                    // allows (its announcement may come after ours).
                    Ok(Answer::UnknownMigration) if Instant::now() + UNKNOWN_RETRY < deadline => {
                        std::thread::sleep(UNKNOWN_RETRY);
                    }
                    other => {
                        debug!(answer = ?other, "the peer refused the HELLO");
                        return Err(refused(other));
                    }
                }
            }
            Err(error) => {
                debug!(error = %Report(&error), "HELLO not answered");
                return Err(classify(&error));
            }
        }
    };
    // Round 2: PROOF, answered by an accept that proves the peer's key.
    let transcript = Transcript {
        source_nonce,
        target_nonce,
        port,
        migration,
        destination: opening.destination.ip(),
        source_gateway: opening.source_gateway,
        target_gateway: opening.target_gateway,
    };
    let proof = Open::Proof(Proof {
        port,
        migration,
        ticket: ticket_of(&target_nonce),
        tag: transcript.tag(key, Label::Proof),
    });
    let (conn, answer) = match dial.dial(proof.encode(), deadline) {
        Ok(established) => established,
        Err(ConnectError::Rejected(RejectedBy::App(payload))) => {
            let answer = Answer::decode(&payload);
            debug!(?answer, "the peer refused the PROOF");
            return Err(refused(answer));
        }
        Err(error) => {
            debug!(error = %Report(&error), "PROOF not answered");
            return Err(classify(&error));
        }
    };
    match Answer::decode(&answer) {
        Ok(Answer::Ok(tag)) if transcript.verify(keys, Label::Accept, &tag).is_some() => Ok(conn),
        other => {
            dial.abort(&conn);
            debug!(answer = ?other, "the peer's accept does not prove one of our keys");
            Err(Fallback::PeerAuthFailed)
        }
    }
}

/// Maps a connect failure to a fallback reason.
pub fn classify(error: &ConnectError) -> Fallback {
    match error {
        // The peer gateway said no, its engine did (pinned memory, resources, no decision in
        // time), or nothing of ours listens there (the CM's own reject, another program).
        ConnectError::Rejected(RejectedBy::App(payload)) => refused(Answer::decode(payload)),
        ConnectError::Rejected(RejectedBy::Transport(_) | RejectedBy::Foreign { .. }) => {
            Fallback::PeerRefused
        }
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
                ConnectError::Rejected(RejectedBy::App(Answer::AuthFailed.encode())),
                Fallback::PeerAuthFailed,
            ),
            (
                ConnectError::Rejected(RejectedBy::App(Answer::NoKey.encode())),
                Fallback::NoPeerKey,
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

    #[test]
    fn the_source_address_is_the_configured_one_or_the_routes() {
        let peer: SocketAddr = "127.0.0.2:7471".parse().unwrap();
        let configured: IpAddr = "10.0.0.5".parse().unwrap();
        assert_eq!(source_address(peer, Some(configured)).unwrap(), configured);
        // Another family: the route's.
        let v6: IpAddr = "fd00::5".parse().unwrap();
        assert_eq!(
            source_address(peer, Some(v6)).unwrap(),
            "127.0.0.1".parse::<IpAddr>().unwrap()
        );
    }
}
