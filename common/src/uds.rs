//! gRPC over unix sockets (feature `uds`): a tonic channel to a socket path, a listener bound
//! afresh, its connections as a server should serve them, and the identity of the socket file
//! (kubelet's device plugin sockets, KubeVirt's node hook socket).

use std::{io, path::Path, time::Duration};

use hyper_util::rt::TokioIo;
use tokio::net::{UnixListener, UnixStream};
use tokio_stream::{Stream, StreamExt, wrappers::UnixListenerStream};
use tonic::transport::{Channel, Endpoint};

mod authority;

pub use authority::ServerConn;

/// A channel to the gRPC server on `path`, connected eagerly within `connect_timeout`.
/// `request_timeout` bounds each call; leave it `None` for long-lived streams.
pub async fn channel(
    path: &Path,
    connect_timeout: Duration,
    request_timeout: Option<Duration>,
) -> Result<Channel, tonic::transport::Error> {
    let path = path.to_path_buf();
    // The URI is required by the API but never used: the connector dials the socket.
    let mut endpoint = Endpoint::from_static("http://localhost").connect_timeout(connect_timeout);
    if let Some(t) = request_timeout {
        endpoint = endpoint.timeout(t);
    }
    endpoint
        .connect_with_connector(tower::service_fn(move |_| {
            let path = path.clone();
            async move { Ok::<_, io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
        }))
        .await
}

/// Binds a fresh listener on `path`, removing a stale socket first. The parent folder is
/// created when missing.
pub fn bind_fresh(path: &Path) -> io::Result<UnixListener> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    UnixListener::bind(path)
}

/// The connections `listener` accepts, for tonic's `serve_with_incoming*`: each a
/// [`ServerConn`], so that clients sending the socket path as `:authority` (grpc-java,
/// grpcurl, Python grpcio, kubelets before 1.26) are served like those sending `localhost`.
pub fn incoming(
    listener: UnixListener,
) -> impl Stream<Item = io::Result<ServerConn<UnixStream>>> + Send + 'static {
    UnixListenerStream::new(listener).map(|conn| conn.map(ServerConn::new))
}

pub use crate::file_id::{FileId, file_id, remove_if_ours};
