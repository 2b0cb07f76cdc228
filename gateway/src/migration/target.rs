//! The target side: the stream listener. Each connect request is judged on the engine thread
//! before anything is allocated for it ([`super::admission`]): a HELLO is answered with a
//! challenge, a PROOF that verifies is admitted; everything else is rejected with its reason.
//! An admitted request is deferred to a tokio task that dials the destination over TCP, then
//! accepts it (with the accept tag that proves this gateway's key) and hands the dialed socket
//! to the stream, or rejects it when the destination does not answer.
//!
//! A stream is admitted only for a target-role migration that names its port and whose target
//! address is this node's (so the gateway is never an open relay, not even for a peer holding
//! the key); a source whose migration is not announced here yet asks again
//! (`crate::streams::outbound`). A request whose source gave up meanwhile (its
//! `--stream-timeout-ms` ran out: it relays that connection over TCP itself) is not dialed:
//! the destination would see an extra, empty connection, which a migration's main channel
//! cannot take. The decision must come within the engine's `unattached_timeout` (10 s; the
//! dial bound stays well below it), and the source waits at most its `--stream-timeout-ms`.

use std::{io, net::SocketAddr, sync::Arc, time::Instant};

use rdma_streams_common::report::Report;
use rdma_streams_transport::{Acceptor, Decision, Engine, Listener, Request};
use tokio::runtime::Handle;
use tracing::{Instrument, debug, info, info_span, warn};

use super::{
    admission::{self, Admitted, Outcome, Verdict},
    source::OpenGuard,
    state::Shared,
};
use crate::{
    metrics::PathKind,
    streams::{
        payload::Answer,
        relay,
        stream::{self, StreamConn},
    },
};

/// Backlog of the stream listener.
const BACKLOG: i32 = 128;

/// The listener's acceptor (see the module docs).
struct GatewayAcceptor {
    shared: Arc<Shared>,
    runtime: Handle,
}

impl Acceptor for GatewayAcceptor {
    fn on_request(&self, request: Request<'_>) -> Decision {
        decide(
            &self.shared,
            &self.runtime,
            request.payload,
            request.peer,
            request.local,
            request.conn,
        )
    }
}

/// The acceptor's decision on one request (`peer`, `local`: the source's and our RDMA
/// addresses as the request shows them): a reject with its answer, or, for an authenticated
/// request, a deferral to [`serve`] on `runtime`.
pub fn decide<C: StreamConn>(
    shared: &Arc<Shared>,
    runtime: &Handle,
    payload: &[u8],
    peer: Option<SocketAddr>,
    local: Option<SocketAddr>,
    conn: C,
) -> Decision {
    match admission::judge(shared, payload, peer, local, Instant::now()) {
        Verdict::Refuse(answer, outcome) => {
            shared.metrics.peer_request(outcome);
            match outcome {
                Outcome::Challenged => debug!(?peer, "challenge issued"),
                _ => info!(?peer, outcome = outcome.as_str(), "stream request refused"),
            }
            Decision::Reject(answer.encode())
        }
        Verdict::Admit(admitted) => {
            shared.metrics.peer_request(Outcome::Admitted);
            let span = info_span!("stream", ?peer, dst = %admitted.destination, uid = %admitted.handles.migration.uid);
            shared.spawn_on(
                serve(shared.clone(), conn, *admitted).instrument(span),
                runtime,
            );
            Decision::Defer
        }
    }
}

/// Listens for streams on `addr` (the rdma_cm port space of the engine); closes when dropped.
/// Must be called inside the gateway's runtime (the decisions run on it).
pub fn listen(shared: Arc<Shared>, engine: &Engine, addr: SocketAddr) -> io::Result<Listener> {
    let acceptor = Arc::new(GatewayAcceptor {
        shared,
        runtime: Handle::current(),
    });
    let listener = engine.listen(addr, None, BACKLOG, acceptor)?;
    info!(%addr, "stream listener up");
    Ok(listener)
}

/// Dials an admitted request's destination, accepts it and carries it until it ends.
pub async fn serve<C: StreamConn>(shared: Arc<Shared>, conn: C, admitted: Admitted) {
    let settings = &shared.settings;
    let Admitted {
        handles,
        destination,
        accept,
    } = admitted;
    if !conn.is_alive() {
        info!("the source gave up before the destination was dialed; not dialing");
        return;
    }
    let tcp = match relay::dial(destination, settings.mark, settings.dial_timeout).await {
        Ok(tcp) => tcp,
        Err(error) => {
            warn!(error = %Report(&error), "dialing the original destination; refusing");
            shared.metrics.peer_request(Outcome::Unreachable);
            conn.reject(Answer::Unreachable.encode());
            return;
        }
    };
    if !conn.is_alive() {
        // Closed at once: the destination sees a connection without a byte.
        info!("the source gave up while the destination was dialed");
        relay::reset(&tcp);
        return;
    }
    conn.accept(Answer::Ok(accept).encode());
    shared.metrics.connections_active.inc();
    let _open = OpenGuard(shared.clone());
    info!("stream connected to its destination");
    // Counted once the stream takes the destination's connection: a source that gave up after
    // the accept leaves nothing counted as carried.
    let counted = shared.clone();
    let taken = move || counted.metrics.connection("target", PathKind::Rdma);
    let end = match stream::carry(&conn, tcp, &handles.cancel, taken).await {
        stream::Carried::Ended(end) => end,
        stream::Carried::Returned(tcp) => {
            // The source's stream died before the attach: the destination saw no byte.
            info!("the stream was gone before it took the destination's connection");
            relay::reset(&tcp);
            return;
        }
    };
    // Our side of the stream is the destination: what we sent went to the source.
    shared
        .metrics
        .add_bytes(PathKind::Rdma, end.received, end.sent);
    match &end.error {
        None => debug!(
            to_target = end.received,
            to_source = end.sent,
            "stream ended"
        ),
        Some(error) => info!(
            to_target = end.received,
            to_source = end.sent,
            %error,
            "stream ended with an error"
        ),
    }
}

#[cfg(test)]
#[path = "target_tests.rs"]
mod tests;
