//! The capture listener: opened in virt-handler's network namespace, where the migration's
//! nftables table redirects its connections to, and the destination each was going to.

use std::{
    io,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    path::Path,
};

use socket2::{Domain, Protocol, SockRef, Socket, Type};
use tokio::net::{TcpListener, TcpStream};

use super::{
    netns::{self, NetnsError},
    nft::NftError,
};

/// Why a capture could not be set up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CaptureError {
    #[error(transparent)]
    Netns(#[from] NetnsError),
    #[error(transparent)]
    Nft(#[from] NftError),
    #[error("capture listener")]
    Listen(#[source] io::Error),
    #[error("blocking task failed: {0}")]
    Task(String),
}

/// Backlog of a capture listener: connections the kernel completes and queues while the
/// gateway cannot accept them (out of file descriptors: it backs off and retries) wait here
/// instead of being refused (the kernel caps it at `net.core.somaxconn`, 4096 by default).
pub const BACKLOG: i32 = 1024;

/// Opens a listener on an ephemeral port of the namespace at `ns` (all addresses of the
/// target's family: `redirect` of locally generated connections lands on loopback), with a
/// [`BACKLOG`] of its own.
pub async fn listen_in(ns: &Path, target: IpAddr) -> Result<TcpListener, CaptureError> {
    let ns = ns.to_owned();
    let bind: SocketAddr = match target {
        IpAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        IpAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let std_listener = tokio::task::spawn_blocking(move || {
        netns::run_in(&ns, move || {
            let socket = Socket::new(Domain::for_address(bind), Type::STREAM, Some(Protocol::TCP))?;
            socket.bind(&bind.into())?;
            socket.listen(BACKLOG)?;
            socket.set_nonblocking(true)?;
            Ok::<_, io::Error>(std::net::TcpListener::from(socket))
        })
    })
    .await
    .map_err(|e| CaptureError::Task(e.to_string()))??
    .map_err(CaptureError::Listen)?;
    TcpListener::from_std(std_listener).map_err(CaptureError::Listen)
}

/// The destination a redirected connection was going to (`SO_ORIGINAL_DST`).
pub fn original_destination(stream: &TcpStream, v6: bool) -> io::Result<SocketAddr> {
    let sock = SockRef::from(stream);
    let addr = if v6 {
        sock.original_dst_v6()?
    } else {
        sock.original_dst_v4()?
    };
    addr.as_socket()
        .ok_or_else(|| io::Error::other("original destination is not an IP address"))
}
