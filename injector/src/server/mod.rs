//! The HTTPS admission server behind `rdma-stream-injector serve`.
//!
//! ```text
//!  --listen (TLS 1.2/1.3, ALPN h2 + http/1.1)
//!        │ tls::CertReloader: re-reads the pair when the files change (kubelet ..data swap);
//!        │ its serial is the `tls certificate` gate of the process's /ready
//!        ▼
//!  https::serve (hyper-util auto, drain) ──► admission::router: POST /mutate
//!                                                 │ AdmissionReview v1 checks, body limit
//!                                                 ▼
//!                                        Handler::review on spawn_blocking, deadline
//!                                                 │
//!                                        AdmissionReview v1 answer (metrics::AdmissionMetrics)
//! ```
//!
//! The admin endpoint (`/live`, `/ready`, `/metrics`) and the drain order are the process
//! runtime's (`rdma_streams_common::runtime`). Wiring (the `serve` subcommand, a test):
//!
//! ```no_run
//! # async fn example(handler: std::sync::Arc<dyn rdma_stream_injector::Handler>)
//! # -> Result<(), Box<dyn std::error::Error>> {
//! use rdma_stream_injector::{Server, ServerConfig};
//! use rdma_streams_common::runtime::Runtime;
//!
//! let rt = Runtime::builder()
//!     .admin(Some(([0, 0, 0, 0], 9990).into()))
//!     .with_signals()
//!     .build()
//!     .await?;
//! let caches = rt.readiness().gate("namespace cache"); // caches.set(true) once synced
//! let config = ServerConfig::new(([0, 0, 0, 0], 8443).into(), "/tls/tls.crt", "/tls/tls.key");
//! let mut registry = prometheus_client::registry::Registry::default();
//! let server = Server::bind(config, handler, rt.readiness().clone(), &mut registry).await?;
//! let _ = rt.metrics().publish(registry);
//! let stop = rt.tasks().shutdown().clone();
//! rt.run(async move {
//!     server.run(stop).await;
//!     Ok::<_, rdma_streams_common::runtime::Error>(())
//! })
//! .await?;
//! # Ok(()) }
//! ```

pub mod admission;
pub mod handler;
pub mod https;
pub mod metrics;
pub mod tls;
pub(crate) mod x509;

#[cfg(test)]
mod tests;

use std::{net::SocketAddr, path::PathBuf, sync::Arc};

use prometheus_client::registry::Registry;
pub use rdma_streams_common::admin::Readiness;
use rdma_streams_common::admin::Status;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub use self::{
    admission::AdmissionConfig,
    handler::{Allowed, Handler, Outcome, Reviewed},
    https::{HttpConfig, Transport},
    metrics::AdmissionMetrics,
    tls::{CertReloader, TlsError},
};

/// Prefix of every metric the server registers.
pub const METRICS_PREFIX: &str = "rdma_stream_injector";

/// What `serve` needs to start the server.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// `--listen`: the HTTPS webhook address.
    pub listen: SocketAddr,
    /// `--tls-cert`: PEM certificate chain, leaf first.
    pub tls_cert: PathBuf,
    /// `--tls-key`: PEM private key (PKCS#8, PKCS#1 or SEC1).
    pub tls_key: PathBuf,
    /// `/mutate` settings.
    pub admission: AdmissionConfig,
    /// Connection settings.
    pub http: HttpConfig,
}

/// The server could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
    /// The certificate or key is unusable.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// A listener could not be bound.
    #[error("cannot listen on {addr}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// A bound, not yet running, admission server.
#[derive(Debug)]
pub struct Server {
    listener: TcpListener,
    local_addr: SocketAddr,
    #[cfg(test)]
    tls: Arc<CertReloader>,
    tls_config: Arc<rustls::ServerConfig>,
    router: axum::Router,
    http: HttpConfig,
    #[cfg(test)]
    metrics: AdmissionMetrics,
}

// === impl ServerConfig ===

impl ServerConfig {
    /// Defaults for everything but the address and the certificate files.
    pub fn new(
        listen: SocketAddr,
        tls_cert: impl Into<PathBuf>,
        tls_key: impl Into<PathBuf>,
    ) -> Self {
        Self {
            listen,
            tls_cert: tls_cert.into(),
            tls_key: tls_key.into(),
            admission: AdmissionConfig::default(),
            http: HttpConfig::default(),
        }
    }
}

// === impl Server ===

impl Server {
    /// Loads and checks the certificate pair, binds the listener, registers the metrics in
    /// `registry` (under [`METRICS_PREFIX`]) and the gate `tls certificate` in `readiness`
    /// (ready, with the serial served). Port 0 binds an ephemeral port; see
    /// [`Server::local_addr`].
    pub async fn bind(
        config: ServerConfig,
        handler: Arc<dyn Handler>,
        readiness: Readiness,
        registry: &mut Registry,
    ) -> Result<Self, ServerError> {
        let ServerConfig {
            listen,
            tls_cert,
            tls_key,
            admission,
            http,
        } = config;
        let tls = Arc::new(CertReloader::load(tls_cert, tls_key)?);
        let tls_config = tls.server_config()?;

        let metrics = AdmissionMetrics::default();
        {
            let sub = registry.sub_registry_with_prefix(METRICS_PREFIX);
            metrics.register(sub);
            tls.metrics().register(sub);
        }

        let (listener, local_addr) = bind(listen).await?;
        tracing::info!(%local_addr, "admission server bound");
        {
            let tls = tls.clone();
            readiness.check("tls certificate", move || {
                let serial = tls.state().serial.unwrap_or_else(|| "?".to_owned());
                Status::ready().with_note(format!("serial {serial}"))
            });
        }

        Ok(Self {
            listener,
            local_addr,
            router: admission::router(handler, admission, metrics.clone()),
            #[cfg(test)]
            tls,
            tls_config,
            http,
            #[cfg(test)]
            metrics,
        })
    }

    /// The HTTPS address actually bound.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The certificate resolver (for [`CertReloader::state`]).
    #[cfg(test)]
    pub fn tls(&self) -> &Arc<CertReloader> {
        &self.tls
    }

    /// The admission metrics.
    #[cfg(test)]
    pub fn metrics(&self) -> &AdmissionMetrics {
        &self.metrics
    }

    /// Serves until `shutdown` is cancelled, then: the listener stops accepting and in-flight
    /// reviews finish (up to `http.drain_timeout`). `/ready` fails before that: the runtime
    /// drains it first.
    pub async fn run(self, shutdown: CancellationToken) {
        let Self {
            listener,
            tls_config,
            router,
            http,
            ..
        } = self;
        let acceptor = tokio_rustls::TlsAcceptor::from(tls_config);
        https::serve(listener, Transport::Tls(acceptor), router, http, shutdown).await;
        tracing::info!("admission server drained");
    }
}

async fn bind(addr: SocketAddr) -> Result<(TcpListener, SocketAddr), ServerError> {
    let bind_error = |source| ServerError::Bind { addr, source };
    let listener = TcpListener::bind(addr).await.map_err(bind_error)?;
    let local = listener.local_addr().map_err(bind_error)?;
    Ok((listener, local))
}
