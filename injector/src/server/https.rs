//! The accept loop: TCP, optional TLS, then HTTP/1.1 or HTTP/2 (hyper-util `auto`) for any
//! tower service, with a graceful drain.
//!
//! ```text
//! accept ─┬─ TLS handshake (deadline) ─ HTTP/1.1 | HTTP/2 ─ service.oneshot(request)
//!         └─ (next connection)
//! shutdown: stop accepting ─ each connection finishes its in-flight requests
//!           (HTTP/1 closes after the current response, HTTP/2 sends GOAWAY)
//!           ─ after the drain deadline the rest are aborted
//! ```

use std::{error::Error as StdError, net::SocketAddr, sync::Arc, time::Duration};

use http::{Request, Response};
use hyper::body::{Body, Incoming};
use hyper_util::{
    rt::{TokioExecutor, TokioIo, TokioTimer},
    server::conn::auto,
};
use rdma_streams_common::report::Report;
use tokio::{
    io::{AsyncRead, AsyncWrite},
    net::{TcpListener, TcpStream},
    task::JoinSet,
};
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;
use tracing::Instrument;

/// A boxed error, as hyper wants them.
pub type BoxError = Box<dyn StdError + Send + Sync>;

/// Connection-level settings.
#[derive(Clone, Debug)]
pub struct HttpConfig {
    /// Time allowed for the client to send a complete HTTP/1 request head. It also closes an
    /// idle HTTP/1 keep-alive connection; the API server prefers HTTP/2, where it does not apply.
    pub header_read_timeout: Duration,
    /// Time allowed for a TLS handshake.
    pub tls_handshake_timeout: Duration,
    /// After shutdown is signalled, how long in-flight requests may run before their
    /// connections are dropped. Keep it below the pod's `terminationGracePeriodSeconds`.
    pub drain_timeout: Duration,
    /// HTTP/2 streams allowed at once per connection.
    pub max_concurrent_streams: u32,
}

impl Default for HttpConfig {
    fn default() -> Self {
        Self {
            header_read_timeout: Duration::from_secs(10),
            tls_handshake_timeout: Duration::from_secs(10),
            drain_timeout: Duration::from_secs(15),
            max_concurrent_streams: 256,
        }
    }
}

/// How accepted TCP connections are wrapped.
#[derive(Clone)]
pub enum Transport {
    /// TLS (the webhook).
    Tls(TlsAcceptor),
}

impl std::fmt::Debug for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Tls(_) => "Tls",
        })
    }
}

/// Serves `service` on every connection accepted from `listener` until `shutdown` is
/// cancelled, then drains (see the module docs) and returns.
///
/// Accept errors (for example `EMFILE`) are logged and retried after a short pause; they never
/// end the loop.
pub async fn serve<S, B>(
    listener: TcpListener,
    transport: Transport,
    service: S,
    config: HttpConfig,
    shutdown: CancellationToken,
) where
    S: tower::Service<Request<Incoming>, Response = Response<B>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(config.header_read_timeout);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(config.max_concurrent_streams);
    let builder = Arc::new(builder);
    let mut connections = JoinSet::new();

    loop {
        tokio::select! {
            biased;
            () = shutdown.cancelled() => break,
            Some(joined) = connections.join_next(), if !connections.is_empty() => {
                if let Err(error) = joined
                    && error.is_panic()
                {
                    tracing::error!(error = %Report(&error), "connection task panicked");
                }
            }
            accepted = listener.accept() => match accepted {
                Ok((tcp, peer)) => {
                    let span = tracing::debug_span!("conn", client.ip = %peer.ip(), client.port = peer.port());
                    connections.spawn(
                        connection(
                            tcp,
                            peer,
                            transport.clone(),
                            builder.clone(),
                            service.clone(),
                            config.tls_handshake_timeout,
                            shutdown.clone(),
                        )
                        .instrument(span),
                    );
                }
                Err(error) => {
                    tracing::warn!(error = %Report(&error), "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
        }
    }

    drop(listener);
    let open = connections.len();
    if open > 0 {
        tracing::info!(connections = open, "draining");
    }
    let drained = tokio::time::timeout(config.drain_timeout, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            connections = connections.len(),
            timeout = ?config.drain_timeout,
            "drain deadline passed; closing the remaining connections"
        );
        connections.shutdown().await;
    }
}

/// Serves one accepted connection.
async fn connection<S, B>(
    tcp: TcpStream,
    peer: SocketAddr,
    transport: Transport,
    builder: Arc<auto::Builder<TokioExecutor>>,
    service: S,
    handshake_timeout: Duration,
    shutdown: CancellationToken,
) where
    S: tower::Service<Request<Incoming>, Response = Response<B>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    if let Err(error) = tcp.set_nodelay(true) {
        tracing::debug!(error = %Report(&error), "TCP_NODELAY");
    }
    match transport {
        Transport::Tls(acceptor) => {
            let handshake = tokio::time::timeout(handshake_timeout, acceptor.accept(tcp));
            let tls = tokio::select! {
                () = shutdown.cancelled() => return,
                tls = handshake => tls,
            };
            match tls {
                Ok(Ok(tls)) => {
                    let alpn = tls.get_ref().1.alpn_protocol().map(String::from_utf8_lossy);
                    tracing::trace!(%peer, alpn = alpn.as_deref().unwrap_or(""), "TLS established");
                    http(tls, &builder, service, shutdown).await;
                }
                Ok(Err(error)) => tracing::debug!(error = %Report(&error), "TLS handshake failed"),
                Err(_) => tracing::debug!(timeout = ?handshake_timeout, "TLS handshake timed out"),
            }
        }
    }
}

/// Runs HTTP on an established stream until the client closes it or shutdown drains it.
async fn http<I, S, B>(
    io: I,
    builder: &auto::Builder<TokioExecutor>,
    service: S,
    shutdown: CancellationToken,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    S: tower::Service<Request<Incoming>, Response = Response<B>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    let service = hyper::service::service_fn(move |request: Request<Incoming>| {
        service.clone().oneshot(request)
    });
    let conn = builder.serve_connection(TokioIo::new(io), service);
    tokio::pin!(conn);
    let result = tokio::select! {
        result = conn.as_mut() => result,
        () = shutdown.cancelled() => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    if let Err(error) = result {
        tracing::debug!(error = %Report(&*error), "connection closed with an error");
    }
}
