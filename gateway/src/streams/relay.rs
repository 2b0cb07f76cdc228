//! The TCP fallback: one captured connection relayed to its original destination over
//! kernel TCP, byte for byte, from the gateway's own network namespace.
//!
//! EOF on one side half-closes the other (`copy_bidirectional`); an error or reset on
//! either side resets the other (`SO_LINGER` 0 then close); cancelling (the migration was
//! aborted) resets both.

use std::{io, net::SocketAddr, time::Duration};

use rdma_streams_common::report::Report;
use socket2::{Domain, Protocol, SockRef, Socket, Type};
use tokio::net::{TcpSocket, TcpStream};
use tokio_util::sync::CancellationToken;
use tracing::debug;

/// A TCP socket to dial destinations of `dst`'s family with, with the gateway's mark (so no
/// capture rule catches it). The capture listener makes one before it accepts a connection
/// (out of file descriptors, it then waits instead of accepting a connection it could not
/// dial on).
pub fn socket_for(dst: SocketAddr, mark: u32) -> io::Result<Socket> {
    let socket = Socket::new(Domain::for_address(dst), Type::STREAM, Some(Protocol::TCP))?;
    if mark != 0
        && let Err(error) = socket.set_mark(mark)
    {
        // Without CAP_NET_ADMIN: only matters when dialing from a captured namespace.
        debug!(error = %Report(&error), "SO_MARK not set");
    }
    Ok(socket)
}

/// Dials `dst` with the gateway's mark (so no capture rule catches it), within `timeout`.
pub async fn dial(dst: SocketAddr, mark: u32, timeout: Duration) -> io::Result<TcpStream> {
    connect(socket_for(dst, mark)?, dst, timeout).await
}

/// Connects `socket` (from [`socket_for`]) to `dst` within `timeout`.
pub async fn connect(socket: Socket, dst: SocketAddr, timeout: Duration) -> io::Result<TcpStream> {
    socket.set_nonblocking(true)?;
    let socket = TcpSocket::from_std_stream(std::net::TcpStream::from(socket));
    let stream = tokio::time::timeout(timeout, socket.connect(dst))
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "connect timed out"))??;
    let _ = stream.set_nodelay(true);
    Ok(stream)
}

/// [`dial`], waiting for a file descriptor when the process has none left (`EMFILE`,
/// `ENFILE`): an accepted connection then waits for others to close instead of being reset.
/// Retries every 50 ms; the whole dial stays within `timeout`.
pub async fn dial_patiently(
    dst: SocketAddr,
    mark: u32,
    timeout: Duration,
) -> io::Result<TcpStream> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        match dial(dst, mark, left).await {
            Err(e)
                if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE))
                    && left > Duration::from_millis(50) =>
            {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            other => return other,
        }
    }
}

/// Bytes buffered per direction of a relay: a migration is a few long bulk transfers, and
/// tokio's default (8 KiB) costs a wake-up and two syscalls per 8 KiB (measured with
/// `gateway/testbed/benches/chain.rs`).
pub const RELAY_BUFFER: usize = 256 * 1024;

/// Resets a connection instead of closing it gracefully.
pub fn reset(stream: &TcpStream) {
    let _ = SockRef::from(stream).set_linger(Some(Duration::ZERO));
}

/// Relays `client` <-> `server` until both directions end, an error, or `cancel`.
/// Returns the bytes moved (client to server, server to client).
pub async fn relay(
    mut client: TcpStream,
    mut server: TcpStream,
    cancel: CancellationToken,
) -> io::Result<(u64, u64)> {
    let result = tokio::select! {
        r = tokio::io::copy_bidirectional_with_sizes(&mut client, &mut server, RELAY_BUFFER, RELAY_BUFFER) => r,
        _ = cancel.cancelled() => Err(io::Error::new(io::ErrorKind::ConnectionAborted, "migration ended")),
    };
    if result.is_err() {
        reset(&client);
        reset(&server);
    }
    result
}
