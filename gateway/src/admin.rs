//! The admin endpoint: `/live`, `/ready`, `/metrics`.

use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
};

use axum::{Router, extract::State, http::StatusCode, response::IntoResponse, routing::get};
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;
use tracing::info;

/// Ready once the event sources and (when RDMA is usable) the stream listener are up.
#[derive(Clone, Debug, Default)]
pub struct Readiness(Arc<AtomicBool>);

impl Readiness {
    pub fn set(&self, ready: bool) {
        self.0.store(ready, Ordering::Release);
    }

    pub fn is_ready(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

#[derive(Clone)]
struct AdminState {
    registry: Arc<Registry>,
    readiness: Readiness,
}

#[derive(Debug, thiserror::Error)]
#[error("binding the admin endpoint on {addr}: {source}")]
pub struct BindError {
    pub addr: SocketAddr,
    #[source]
    pub source: std::io::Error,
}

/// The admin routes.
pub fn router(registry: Arc<Registry>, readiness: Readiness) -> Router {
    Router::new()
        .route("/live", get(|| async { "live\n" }))
        .route("/ready", get(ready))
        .route("/metrics", get(metrics))
        .with_state(AdminState {
            registry,
            readiness,
        })
}

async fn ready(State(s): State<AdminState>) -> impl IntoResponse {
    if s.readiness.is_ready() {
        (StatusCode::OK, "ready\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready\n")
    }
}

async fn metrics(State(s): State<AdminState>) -> impl IntoResponse {
    (
        [(
            "content-type",
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        crate::metrics::encode(&s.registry),
    )
}

/// Binds the admin endpoint.
pub async fn bind(addr: SocketAddr) -> Result<tokio::net::TcpListener, BindError> {
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| BindError { addr, source })
}

/// Serves until `shutdown`.
pub async fn serve(
    listener: tokio::net::TcpListener,
    registry: Arc<Registry>,
    readiness: Readiness,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    if let Ok(addr) = listener.local_addr() {
        info!(%addr, "admin endpoint listening");
    }
    axum::serve(listener, router(registry, readiness))
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await
}
