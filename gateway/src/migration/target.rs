//! The target side: the stream listener. Each connect request names a destination and a
//! migration (`crate::streams::payload`); the listener's acceptor, which runs on the engine thread and
//! must not block, defers its decision to a tokio task that looks the migration up, dials the
//! destination over TCP, then accepts the request and hands the dialed socket to the stream, or
//! rejects it with the reason.
//!
//! A stream is accepted only for a target-role migration that names its destination (so the
//! gateway is never an open relay); a request that arrives before the migration was announced
//! here waits up to `announce_grace` for it. A request whose source gave up meanwhile (its
//! `--stream-timeout-ms` ran out: it relays that connection over TCP itself) is not dialed: the
//! destination would see an extra, empty connection, which a migration's main channel cannot
//! take. The decision must come within the engine's
//! `unattached_timeout` (10 s; the grace and the dial bound stay well below it), and the source
//! waits at most its `--stream-timeout-ms` for it.

use std::{io, net::SocketAddr, sync::Arc, time::Instant};

use rdma_streams_common::report::Report;
use rdma_streams_transport::{Acceptor, Decision, Engine, Listener, Request};
use tokio::runtime::Handle;
use tracing::{Instrument, debug, info, info_span, warn};

use super::{source::OpenGuard, state::Shared};
use crate::{
    metrics::PathKind,
    streams::{
        payload::{Answer, Open},
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
        let peer = request.peer;
        let open = match Open::decode(request.payload) {
            Ok(open) => open,
            Err(error) => {
                warn!(error = %Report(&error), ?peer, "a connect request that is not a gateway's; refusing");
                return Decision::Reject(Answer::BadRequest.encode());
            }
        };
        let span =
            info_span!("stream", ?peer, dst = %open.destination, migration = %open.migration);
        self.shared.spawn_on(
            serve(self.shared.clone(), request.conn, open).instrument(span),
            &self.runtime,
        );
        Decision::Defer
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

/// Decides on one deferred request and, once accepted, carries it until it ends.
pub async fn serve<C: StreamConn>(shared: Arc<Shared>, conn: C, open: Open) {
    let settings = &shared.settings;
    let deadline = Instant::now() + settings.announce_grace;
    let handles = loop {
        if let Some(h) = shared.target_handles(&open.migration, open.destination) {
            break h;
        }
        if Instant::now() >= deadline {
            warn!("no such target migration here; refusing");
            conn.reject(Answer::UnknownMigration.encode());
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    if !conn.is_alive() {
        info!("the source gave up before the migration was announced here; not dialing");
        return;
    }
    let tcp = match relay::dial(open.destination, settings.mark, settings.dial_timeout).await {
        Ok(tcp) => tcp,
        Err(error) => {
            warn!(error = %Report(&error), "dialing the original destination; refusing");
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
    conn.accept(Answer::Ok.encode());
    shared.metrics.connections_active.inc();
    let _open = OpenGuard(shared.clone());
    info!(uid = %handles.migration.uid, "stream connected to its destination");
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
mod tests {
    use std::time::Duration;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;
    use crate::{
        capture::netns::PathLocator,
        events::{MigrationEvent, Role},
        migration::{GatewayCore, Settings},
        streams::stream::double::{Call, FakeConn},
        testing::{core_with_settings, within},
    };

    fn core(grace: Duration) -> GatewayCore {
        core_with_settings(
            PathLocator("/nonexistent/ns".into()),
            Settings {
                announce_grace: grace,
                dial_timeout: Duration::from_secs(2),
                mark: 0,
                ..Settings::default()
            },
        )
    }

    fn started(target: SocketAddr) -> MigrationEvent {
        MigrationEvent::Started(crate::events::Migration {
            uid: "u1".into(),
            id: "m1".into(),
            vmi: "default/vm1".into(),
            role: Role::Target,
            target: target.ip(),
            ports: vec![target.port()],
            started: None,
        })
    }

    #[test]
    fn unknown_migrations_and_unreachable_destinations_are_refused_with_their_reason() {
        within(Duration::from_secs(20), || async {
            let core = core(Duration::from_millis(200));
            let shared = core.shared().clone();
            // A port nothing listens on: the dial is refused.
            let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let dst = closed.local_addr().unwrap();
            drop(closed);

            // No migration at all: refused after the grace.
            let conn = FakeConn::default();
            let t0 = Instant::now();
            serve(shared.clone(), conn.clone(), Open::new(dst, "u1")).await;
            assert!(
                t0.elapsed() >= Duration::from_millis(200),
                "waited for the announce"
            );
            assert_eq!(
                conn.calls(),
                [Call::Reject(Answer::UnknownMigration.encode())]
            );

            core.handle(started(dst)).await;
            // Another migration's uid, or another destination of this one: unknown.
            for open in [
                Open::new(dst, "u2"),
                Open::new(SocketAddr::new(dst.ip(), dst.port().wrapping_add(1)), "u1"),
            ] {
                let conn = FakeConn::default();
                serve(shared.clone(), conn.clone(), open).await;
                assert_eq!(
                    conn.calls(),
                    [Call::Reject(Answer::UnknownMigration.encode())]
                );
            }
            // Known, but the destination refuses the dial.
            let conn = FakeConn::default();
            serve(shared.clone(), conn.clone(), Open::new(dst, "u1")).await;
            assert_eq!(conn.calls(), [Call::Reject(Answer::Unreachable.encode())]);
            assert_eq!(shared.metrics.connections_active.get(), 0);
        });
    }

    #[test]
    fn a_request_whose_source_gave_up_is_never_dialed() {
        within(Duration::from_secs(20), || async {
            let core = core(Duration::from_millis(300));
            let shared = core.shared().clone();
            let destination = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let dst = destination.local_addr().unwrap();
            let conn = FakeConn::default();
            let serving = tokio::spawn(serve(shared.clone(), conn.clone(), Open::new(dst, "u1")));
            // The source times out and falls back while the request waits for its announce.
            tokio::time::sleep(Duration::from_millis(100)).await;
            conn.kill();
            core.handle(started(dst)).await;
            serving.await.unwrap();
            assert_eq!(conn.calls(), []);
            let dialed =
                tokio::time::timeout(Duration::from_millis(300), destination.accept()).await;
            assert!(dialed.is_err(), "the destination saw a connection");
        });
    }

    #[test]
    fn a_request_waits_for_its_announce_then_carries_until_the_abort() {
        within(Duration::from_secs(20), || async {
            let core = core(Duration::from_secs(5));
            let shared = core.shared().clone();
            let destination = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let dst = destination.local_addr().unwrap();
            let conn = FakeConn::default();
            // The request comes first; the migration is announced 100 ms later.
            let serving = tokio::spawn(serve(shared.clone(), conn.clone(), Open::new(dst, "u1")));
            tokio::time::sleep(Duration::from_millis(100)).await;
            core.handle(started(dst)).await;
            let (mut server, _) = destination.accept().await.unwrap();
            while conn.calls().len() < 2 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            assert_eq!(
                conn.calls(),
                [Call::Accept(Answer::Ok.encode()), Call::Attach]
            );
            assert_eq!(shared.metrics.connections_active.get(), 1);
            // The attached socket is the dialed one: the destination's bytes reach the stream.
            server.write_all(b"ping").await.unwrap();
            let echo = {
                let conn = conn.clone();
                tokio::task::spawn_blocking(move || conn.echo(4))
                    .await
                    .unwrap()
                    .unwrap()
            };
            assert_eq!(echo, b"ping");
            assert_eq!(shared.metrics.connections_of("target", PathKind::Rdma), 1);
            let mut back = [0u8; 4];
            server.read_exact(&mut back).await.unwrap();
            // The migration is aborted: its stream is reset, the destination sees the end.
            core.handle(MigrationEvent::Ended {
                uid: "u1".into(),
                aborted: true,
                migration: None,
            })
            .await;
            serving.await.unwrap();
            assert_eq!(conn.calls().last(), Some(&Call::Abort));
            let mut rest = Vec::new();
            assert_eq!(server.read_to_end(&mut rest).await.unwrap_or(0), 0);
            assert_eq!(shared.metrics.connections_active.get(), 0);
        });
    }

    #[test]
    fn a_stream_gone_before_it_took_the_destination_connection_is_not_counted() {
        within(Duration::from_secs(20), || async {
            let core = core(Duration::from_secs(5));
            let shared = core.shared().clone();
            let destination = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let dst = destination.local_addr().unwrap();
            core.handle(started(dst)).await;
            let conn = FakeConn::default();
            let serving = tokio::spawn(serve(shared.clone(), conn.clone(), Open::new(dst, "u1")));
            let (mut server, _) = destination.accept().await.unwrap();
            while conn.calls().len() < 2 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            // The source aborted right after the accept: the engine finds the stream gone at
            // the attach and gives the destination's connection back.
            conn.give_back();
            serving.await.unwrap();
            let mut rest = Vec::new();
            let read = server.read_to_end(&mut rest).await;
            assert!(rest.is_empty(), "the destination got bytes: {read:?}");
            assert_eq!(shared.metrics.connections_of("target", PathKind::Rdma), 0);
            assert_eq!(shared.metrics.connections_active.get(), 0);
        });
    }
}
