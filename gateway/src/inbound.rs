//! The target side: accept streams from peer gateways, read the first frame, dial the
//! original destination over TCP and pump. One thread accepts; one thread per stream.
//!
//! A stream is accepted only for a target-role migration that names its destination (so
//! the gateway is never an open relay); a stream that arrives before the migration was
//! announced here waits up to `announce_grace` for it.

use std::{
    io::Write,
    net::{SocketAddr, TcpStream},
    os::fd::OwnedFd,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use rdma_streams_transport::{Events, PollFd, PumpOptions, RSocket, RSocketError, poll, pump};
use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use tracing::{debug, info, info_span, warn};

use crate::{
    core::Shared,
    frame::{Answer, MAX_OPEN_LEN, Open},
    metrics::PathKind,
};

/// Starts listening for streams on `listen` and accepting on a thread until `stop`.
pub fn spawn(
    shared: Arc<Shared>,
    listen: SocketAddr,
    stop: Arc<AtomicBool>,
) -> Result<thread::JoinHandle<()>, RSocketError> {
    let provider = match &shared.provider {
        Ok(p) => p.clone(),
        Err(_) => {
            return Err(RSocketError::Create(std::io::Error::from_raw_os_error(
                libc::ENODEV,
            )));
        }
    };
    let listener = RSocket::listen_on(&provider, listen, 128)?;
    listener.set_nonblocking(true).map_err(RSocketError::Mode)?;
    info!(%listen, "stream listener up");
    thread::Builder::new()
        .name("gw-accept".into())
        .spawn(move || accept_loop(shared, listener, stop))
        .map_err(RSocketError::Mode)
}

fn accept_loop(shared: Arc<Shared>, listener: RSocket, stop: Arc<AtomicBool>) {
    while !stop.load(Ordering::Acquire) {
        let mut fds = [PollFd::rsocket(&listener, Events::READABLE)];
        if poll(
            listener.provider(),
            &mut fds,
            Some(Duration::from_millis(100)),
        )
        .is_err()
        {
            thread::sleep(Duration::from_millis(100));
            continue;
        }
        match listener.accept() {
            Ok((stream, from)) => {
                let shared = shared.clone();
                let spawned = thread::Builder::new()
                    .name("gw-stream".into())
                    .spawn(move || {
                        let _span = info_span!("stream", %from).entered();
                        serve(&shared, stream);
                    });
                if let Err(error) = spawned {
                    warn!(%error, "no thread for an incoming stream");
                }
            }
            Err(RSocketError::Accept(e)) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(error) => {
                warn!(%error, "accept on the stream listener");
                thread::sleep(Duration::from_millis(50));
            }
        }
    }
    info!("stream listener closed");
}

/// Reads the first frame (and any bytes after it) before `deadline`.
fn read_open(stream: &RSocket, deadline: Instant) -> Option<(Open, Vec<u8>)> {
    let mut buf = vec![0u8; MAX_OPEN_LEN];
    let mut got = 0;
    loop {
        match Open::decode(&buf[..got]) {
            Ok(Some((open, used))) => return Some((open, buf[used..got].to_vec())),
            Ok(None) if got < buf.len() => {}
            Ok(None) => return None,
            Err(error) => {
                warn!(%error, "bad first frame");
                return None;
            }
        }
        let now = Instant::now();
        if now >= deadline {
            warn!("no first frame in time");
            return None;
        }
        let mut fds = [PollFd::rsocket(stream, Events::READABLE)];
        poll(
            stream.provider(),
            &mut fds,
            Some((deadline - now).min(Duration::from_millis(100))),
        )
        .ok()?;
        if fds[0].revents().is_empty() {
            continue;
        }
        match stream.read(&mut buf[got..]) {
            Ok(0) => return None,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(_) => return None,
        }
    }
}

fn dial(dst: SocketAddr, mark: u32, timeout: Duration) -> std::io::Result<TcpStream> {
    let socket = Socket::new(Domain::for_address(dst), Type::STREAM, Some(Protocol::TCP))?;
    if mark != 0 {
        let _ = socket.set_mark(mark);
    }
    socket.connect_timeout(&SockAddr::from(dst), timeout)?;
    let _ = socket.set_tcp_nodelay(true);
    Ok(socket.into())
}

fn serve(shared: &Shared, stream: RSocket) {
    let settings = &shared.settings;
    let _ = stream.set_nonblocking(false);
    let Some((open, early)) = read_open(&stream, Instant::now() + settings.stream_timeout) else {
        return;
    };
    let deadline = Instant::now() + settings.announce_grace;
    let handles = loop {
        if let Some(h) = shared.target_handles(&open.uid, open.destination) {
            break h;
        }
        if Instant::now() >= deadline {
            warn!(uid = %open.uid, dst = %open.destination, "no such target migration here; refusing");
            let _ = stream.write_all(&Answer::UnknownMigration.encode());
            return;
        }
        thread::sleep(Duration::from_millis(20));
    };
    let mut tcp = match dial(open.destination, settings.mark, settings.dial_timeout) {
        Ok(tcp) => tcp,
        Err(error) => {
            warn!(%error, dst = %open.destination, "dialing the original destination");
            let _ = stream.write_all(&Answer::Unreachable.encode());
            return;
        }
    };
    if !early.is_empty() && tcp.write_all(&early).is_err() {
        return;
    }
    if stream.write_all(&Answer::Ok.encode()).is_err() {
        return;
    }
    shared.metrics.connection("target", PathKind::Rdma);
    shared.metrics.connections_active.inc();
    info!(uid = %open.uid, dst = %open.destination, "stream connected to its destination");
    let opts = PumpOptions {
        stop: handles.stop.clone(),
        buffer_size: settings.pump_buffer,
        ..PumpOptions::default()
    };
    let report = pump(OwnedFd::from(tcp), stream, opts);
    shared.metrics.connections_active.dec();
    // The pump's "remote" is the stream from the source: local -> remote flows to the source.
    shared
        .metrics
        .add_bytes(PathKind::Rdma, report.to_local, report.to_remote);
    debug!(to_target = report.to_local, to_source = report.to_remote, end = ?report.end, "stream ended");
}
