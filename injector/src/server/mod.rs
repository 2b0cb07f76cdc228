//! The HTTPS admission server behind `rdma-stream-injector serve`.
//!
//! ```text
//!  --listen (TLS 1.2/1.3, ALPN h2 + http/1.1)        --admin-listen (plain HTTP)
//!        │ tls::CertReloader: re-reads the pair          │ admin: /live /ready /metrics
//!        │ when the files change (kubelet ..data swap)   │   /ready = TLS loaded ∧ gates ∧ ¬draining
//!        ▼                                               ▼
//!  https::serve (hyper-util auto, drain) ──► admission::router: POST /mutate
//!                                                 │ AdmissionReview v1 checks, body limit
//!                                                 ▼
//!                                        Handler::review on spawn_blocking, deadline
//!                                                 │
//!                                        AdmissionReview v1 answer (metrics::AdmissionMetrics)
//! ```
//!
//! Wiring (the `serve` subcommand, a benchmark or a test):
//!
//! ```no_run
//! # async fn example(handler: std::sync::Arc<dyn rdma_stream_injector::server::Handler>)
//! # -> Result<(), rdma_stream_injector::server::ServerError> {
//! use rdma_stream_injector::server::{Readiness, Server, ServerConfig};
//! use tokio_util::sync::CancellationToken;
//!
//! let mut config = ServerConfig::new(([0, 0, 0, 0], 8443).into(), "/tls/tls.crt", "/tls/tls.key");
//! config.admin_listen = Some(([0, 0, 0, 0], 9990).into());
//! let readiness = Readiness::new();
//! let caches = readiness.gate("namespace cache"); // caches.set(true) once synced
//! let server = Server::bind(config, handler, readiness, prometheus_client::registry::Registry::default()).await?;
//! let shutdown = CancellationToken::new(); // cancel on SIGTERM
//! server.run(shutdown).await;
//! # Ok(()) }
//! ```

pub mod admin;
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
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub use self::{
    admin::{AdminState, Readiness, ReadyGate},
    admission::{AdmissionConfig, ErrorPolicy},
    handler::{Allowed, Handler, Outcome, Reviewed},
    https::{HttpConfig, Transport},
    metrics::{AdmissionMetrics, TlsMetrics},
    tls::{CertReloader, TlsError, TlsState},
};

/// Prefix of every metric the server registers.
pub const METRICS_PREFIX: &str = "rdma_stream_injector";

/// What `serve` needs to start the server.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// `--listen`: the HTTPS webhook address.
    pub listen: SocketAddr,
    /// `--admin-listen`: `/live`, `/ready`, `/metrics` over plain HTTP; none when `None`.
    pub admin_listen: Option<SocketAddr>,
    /// `--tls-cert`: PEM certificate chain, leaf first.
    pub tls_cert: PathBuf,
    /// `--tls-key`: PEM private key (PKCS#8, PKCS#1 or SEC1).
    pub tls_key: PathBuf,
    /// `/mutate` settings.
    pub admission: AdmissionConfig,
    /// Connection settings, shared by both listeners.
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
    admin: Option<(TcpListener, SocketAddr)>,
    tls: Arc<CertReloader>,
    tls_config: Arc<rustls::ServerConfig>,
    router: axum::Router,
    admin_state: AdminState,
    http: HttpConfig,
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
            admin_listen: None,
            tls_cert: tls_cert.into(),
            tls_key: tls_key.into(),
            admission: AdmissionConfig::default(),
            http: HttpConfig::default(),
        }
    }
}

// === impl Server ===

impl Server {
    /// Loads and checks the certificate pair, binds both listeners and registers the metrics
    /// in `registry` (under [`METRICS_PREFIX`]). Port 0 binds an ephemeral port; see
    /// [`Server::local_addr`].
    pub async fn bind(
        config: ServerConfig,
        handler: Arc<dyn Handler>,
        readiness: Readiness,
        mut registry: Registry,
    ) -> Result<Self, ServerError> {
        let ServerConfig {
            listen,
            admin_listen,
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
        let admin = match admin_listen {
            Some(addr) => Some(bind(addr).await?),
            None => None,
        };
        tracing::info!(%local_addr, admin = ?admin.as_ref().map(|(_, a)| *a), "admission server bound");

        Ok(Self {
            listener,
            local_addr,
            admin,
            router: admission::router(handler, admission, metrics.clone()),
            admin_state: AdminState {
                readiness,
                tls: Some(tls.clone()),
                registry: Arc::new(registry),
            },
            tls,
            tls_config,
            http,
            metrics,
        })
    }

    /// The HTTPS address actually bound.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The admin address actually bound, if any.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin.as_ref().map(|(_, addr)| *addr)
    }

    /// The certificate resolver (for [`CertReloader::state`]).
    pub fn tls(&self) -> &Arc<CertReloader> {
        &self.tls
    }

    /// The admission metrics (counters can be read directly, e.g. by a benchmark).
    pub fn metrics(&self) -> &AdmissionMetrics {
        &self.metrics
    }

    /// Serves until `shutdown` is cancelled, then: `/ready` turns 503, the HTTPS listener stops
    /// accepting, in-flight reviews finish (up to `http.drain_timeout`), and the admin server
    /// stops last.
    pub async fn run(self, shutdown: CancellationToken) {
        let Self {
            listener,
            admin,
            tls_config,
            router,
            admin_state,
            http,
            ..
        } = self;
        let readiness = admin_state.readiness.clone();
        let admin_shutdown = CancellationToken::new();

        let admin = async {
            if let Some((listener, _)) = admin {
                let router = admin::router(admin_state);
                https::serve(
                    listener,
                    Transport::Plain,
                    router,
                    http.clone(),
                    admin_shutdown.clone(),
                )
                .await;
            }
        };
        let webhook = async {
            let acceptor = tokio_rustls::TlsAcceptor::from(tls_config);
            https::serve(
                listener,
                Transport::Tls(acceptor),
                router,
                http.clone(),
                shutdown.clone(),
            )
            .await;
            tracing::info!("admission server drained");
            admin_shutdown.cancel();
        };
        let mark_draining = async {
            shutdown.cancelled().await;
            readiness.drain();
        };
        tokio::join!(admin, webhook, mark_draining);
    }

    /// Runs the server on a task (tests, benchmarks).
    pub fn spawn(self, shutdown: CancellationToken) -> tokio::task::JoinHandle<()> {
        tokio::spawn(self.run(shutdown))
    }
}

async fn bind(addr: SocketAddr) -> Result<(TcpListener, SocketAddr), ServerError> {
    let bind_error = |source| ServerError::Bind { addr, source };
    let listener = TcpListener::bind(addr).await.map_err(bind_error)?;
    let local = listener.local_addr().map_err(bind_error)?;
    Ok((listener, local))
}
