//! The source side: the connections captured for a migration, each carried over an RDMA stream
//! to the peer gateway, or over TCP (the fallback).

use std::{io, net::SocketAddr, sync::Arc, time::Duration};

use rdma_streams_common::report::Report;
use socket2::Socket;
use tokio::net::{TcpListener, TcpStream};
use tracing::{Instrument, debug, info, info_span, warn};

use super::state::{Handles, Shared};
use crate::{
    capture::original_destination,
    metrics::PathKind,
    streams::{Fallback, outbound, payload::UidDigest, relay, stream},
};

/// How long the capture listener pauses after an accept failed for want of resources (file
/// descriptors, memory): the connections wait in the kernel's backlog meanwhile.
pub const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Whether an error says the process (or the system) is out of a resource that frees up by
/// itself as connections close: waiting helps, retrying at once would spin.
pub fn out_of_resources(error: &io::Error) -> bool {
    matches!(
        error.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    )
}

/// Accepts captured connections until the migration ends; the listener closes on return.
///
/// A failed accept never drops a connection: out of file descriptors (`EMFILE`) or memory, the
/// listener pauses [`ACCEPT_BACKOFF`] (the connections stay queued in the kernel's backlog,
/// `capture::listen_in`) and counts it, and logs once per run of failures; a connection that
/// failed before it was accepted (`ECONNABORTED`) is gone already. A connection is accepted
/// only with the socket its TCP fallback would dial with in hand (made first): with
/// descriptors short, accepting more connections than can be dialed would leave each waiting
/// for a descriptor the others hold.
pub async fn accept_loop(shared: Arc<Shared>, listener: TcpListener, handles: Handles) {
    let v6 = handles.migration.target.is_ipv6();
    let target = SocketAddr::new(handles.migration.target, 0);
    let mut starved = false;
    loop {
        let accepted = tokio::select! {
            a = async {
                let reserve = relay::socket_for(target, shared.settings.mark)?;
                let (stream, from) = listener.accept().await?;
                Ok::<_, io::Error>((stream, from, reserve))
            } => a,
            _ = handles.capture_cancel.cancelled() => break,
        };
        let (stream, from, reserve) = match accepted {
            Ok(a) => {
                if std::mem::take(&mut starved) {
                    info!("the capture listener accepts again");
                }
                a
            }
            Err(error) if out_of_resources(&error) => {
                shared.metrics.capture_accept_errors.inc();
                if !std::mem::replace(&mut starved, true) {
                    warn!(error = %Report(&error), "the capture listener cannot accept (out of resources): connections wait in its backlog");
                }
                tokio::select! {
                    () = tokio::time::sleep(ACCEPT_BACKOFF) => continue,
                    _ = handles.capture_cancel.cancelled() => break,
                }
            }
            Err(error) => {
                shared.metrics.capture_accept_errors.inc();
                debug!(error = %Report(&error), "accept on the capture listener");
                continue;
            }
        };
        let dst = match original_destination(&stream, v6) {
            Ok(dst) if handles.migration.matches(dst) => dst,
            Ok(dst) => {
                warn!(%dst, "captured a connection this migration does not name; closing");
                shared.metrics.unmatched.inc();
                continue;
            }
            Err(error) => {
                warn!(error = %Report(&error), "no SO_ORIGINAL_DST; closing");
                shared.metrics.unmatched.inc();
                continue;
            }
        };
        let span = info_span!("conn", %from, %dst);
        shared.spawn(carry(shared.clone(), stream, dst, handles.clone(), reserve).instrument(span));
    }
    debug!("capture listener closed");
}

/// Milliseconds since `t` (a number in the JSON logs).
fn millis(t: std::time::Instant) -> u64 {
    u64::try_from(t.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// Decrements the open-connections gauge when dropped.
pub(crate) struct OpenGuard(pub(crate) Arc<Shared>);

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0.metrics.connections_active.dec();
    }
}

/// Carries one captured connection to `dst`: over an RDMA stream to the peer gateway, or, on
/// any failure before the stream is established (nothing was read from `client` yet), over
/// TCP from this gateway (dialing with `reserve`), counted with the reason.
pub async fn carry(
    shared: Arc<Shared>,
    client: TcpStream,
    dst: SocketAddr,
    handles: Handles,
    reserve: Socket,
) {
    shared.metrics.connections_active.inc();
    let _open = OpenGuard(shared.clone());
    let _ = client.set_nodelay(true);
    let opening = std::time::Instant::now();
    let keys = shared.keys.current();
    let attempt = match (&shared.rdma, shared.peers.lookup(dst.ip())) {
        (Err(reason), _) => Err(*reason),
        (Ok(_), _) if keys.is_empty() => Err(Fallback::NoPeerKey),
        (Ok(_), None) => Err(Fallback::NoPeer),
        (Ok(engine), Some(peer)) => {
            let engine = engine.clone();
            let migration = UidDigest::of(&handles.migration.uid);
            let timeout = shared.settings.stream_timeout;
            let source = shared.settings.stream_source;
            tokio::task::spawn_blocking(move || {
                outbound::open_stream(&engine, peer, source, &keys, dst, migration, timeout)
            })
            .await
            .unwrap_or(Err(Fallback::RdmaError))
        }
    };
    match attempt {
        Ok(conn) => {
            // The stream carries it: the descriptor kept for a TCP fallback is free again.
            drop(reserve);
            info!(
                path = "rdma",
                open_ms = millis(opening),
                "connection carried over an RDMA stream"
            );
            // Counted once the stream takes the connection: one that comes back goes over TCP
            // and is counted there, once.
            let counted = shared.clone();
            let taken = move || counted.metrics.connection("source", PathKind::Rdma);
            let end = match stream::carry(&conn, client, &handles.cancel, taken).await {
                stream::Carried::Ended(end) => end,
                stream::Carried::Returned(client) => {
                    // The stream died between its establishment and the attach: nothing was
                    // read from the connection yet, so it can still go over TCP.
                    info!("the stream was gone before it took the connection");
                    return over_tcp(
                        &shared,
                        client,
                        dst,
                        Fallback::RdmaError,
                        opening,
                        &handles,
                        None,
                    )
                    .await;
                }
            };
            shared
                .metrics
                .add_bytes(PathKind::Rdma, end.sent, end.received);
            match &end.error {
                None => info!(
                    to_target = end.sent,
                    to_source = end.received,
                    "stream ended"
                ),
                Some(error) => info!(
                    to_target = end.sent,
                    to_source = end.received,
                    %error,
                    "stream ended with an error"
                ),
            }
        }
        Err(reason) => {
            over_tcp(
                &shared,
                client,
                dst,
                reason,
                opening,
                &handles,
                Some(reserve),
            )
            .await
        }
    }
}

/// Relays `client` to `dst` over TCP from this gateway, counted with `reason` (the attempt at
/// a stream began at `opening`), dialing with `reserve` when there is one.
async fn over_tcp(
    shared: &Shared,
    client: TcpStream,
    dst: SocketAddr,
    reason: Fallback,
    opening: std::time::Instant,
    handles: &Handles,
    reserve: Option<Socket>,
) {
    shared.metrics.fallback(reason);
    shared.metrics.connection("source", PathKind::Tcp);
    info!(
        path = "tcp",
        %reason,
        after_ms = millis(opening),
        "connection relayed over TCP"
    );
    let dialed = match reserve {
        Some(socket) => relay::connect(socket, dst, shared.settings.dial_timeout).await,
        None => {
            relay::dial_patiently(dst, shared.settings.mark, shared.settings.dial_timeout).await
        }
    };
    let server = match dialed {
        Ok(s) => s,
        Err(error) => {
            // As if virt-handler had dialed and failed: it sees a reset.
            warn!(error = %Report(&error), "TCP fallback dial failed");
            relay::reset(&client);
            return;
        }
    };
    match relay::relay(client, server, handles.cancel.clone()).await {
        Ok((to_target, to_source)) => {
            shared
                .metrics
                .add_bytes(PathKind::Tcp, to_target, to_source);
            info!(to_target, to_source, "relay ended");
        }
        Err(error) => info!(error = %Report(&error), "relay ended with an error"),
    }
}
