//! The source side of a stream: connect to the peer gateway, send the first frame, wait
//! for its answer. Blocking (rsocket calls); run on a blocking thread.

use std::{
    io,
    net::SocketAddr,
    time::{Duration, Instant},
};

use rdma_streams_transport::{Events, PollFd, Provider, RSocket, RSocketError, poll};
use tracing::debug;

use crate::{
    fallback::Fallback,
    frame::{ANSWER_LEN, Answer, Open},
};

/// Opens a confirmed stream to `peer` for `open`, or says why not (nothing was read from
/// the captured connection yet, so the caller can still relay it over TCP).
pub fn open_stream(
    provider: &Provider,
    peer: SocketAddr,
    open: &Open,
    timeout: Duration,
) -> Result<RSocket, Fallback> {
    let deadline = Instant::now() + timeout;
    let socket = RSocket::connect_to(provider, peer, timeout).map_err(classify)?;
    let _ = socket.set_nodelay(true);
    socket.write_all(&open.encode()).map_err(|error| {
        debug!(%error, %peer, "writing the first frame");
        Fallback::RdmaError
    })?;
    let mut buf = [0u8; ANSWER_LEN];
    read_exact_by(&socket, &mut buf, deadline)?;
    match Answer::decode(&buf) {
        Ok(Answer::Ok) => Ok(socket),
        Ok(answer) => {
            debug!(?answer, %peer, "peer gateway declined");
            Err(Fallback::PeerRefused)
        }
        Err(error) => {
            debug!(%error, %peer, "bad answer");
            Err(Fallback::RdmaError)
        }
    }
}

/// Maps a connect failure to a fallback reason.
pub fn classify(error: RSocketError) -> Fallback {
    debug!(%error, "rsocket connect failed");
    match &error {
        RSocketError::ConnectTimeout { .. } => Fallback::Timeout,
        RSocketError::Create(_) => Fallback::NoDevice,
        _ => match error.errno() {
            Some(libc::ECONNREFUSED | libc::EHOSTUNREACH | libc::ENETUNREACH) => {
                Fallback::PeerRefused
            }
            Some(libc::ETIMEDOUT) => Fallback::Timeout,
            Some(libc::ENODEV) => Fallback::NoDevice,
            _ => Fallback::RdmaError,
        },
    }
}

/// Reads exactly `buf.len()` bytes before `deadline` from a blocking rsocket.
pub fn read_exact_by(socket: &RSocket, buf: &mut [u8], deadline: Instant) -> Result<(), Fallback> {
    let mut got = 0;
    while got < buf.len() {
        let now = Instant::now();
        if now >= deadline {
            return Err(Fallback::Timeout);
        }
        let mut fds = [PollFd::rsocket(socket, Events::READABLE)];
        poll(
            socket.provider(),
            &mut fds,
            Some((deadline - now).min(Duration::from_millis(100))),
        )
        .map_err(|_| Fallback::RdmaError)?;
        if fds[0].revents().is_empty() {
            continue;
        }
        match socket.read(&mut buf[got..]) {
            Ok(0) => return Err(Fallback::PeerRefused),
            Ok(n) => got += n,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                ) => {}
            Err(_) => return Err(Fallback::RdmaError),
        }
    }
    Ok(())
}
