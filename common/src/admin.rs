//! The one admin endpoint every long-running binary serves: `/live`, `/ready`, `/metrics`
//! (OpenMetrics text of a `prometheus-client` registry), on its own listener, until shutdown.
//!
//! What "ready" means is the binary's: it implements [`ReadinessReport`] (the device plugin:
//! every pool registered with kubelet; the gateway: event sources and stream listener up).

use std::{net::SocketAddr, sync::Arc};

use axum::{Router, extract::State, http::StatusCode, response::IntoResponse, routing::get};
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;
use tracing::info;

/// A binary's readiness, for `/ready`.
pub trait ReadinessReport: Clone + Send + Sync + 'static {
    /// Ready or not, and the body that explains it (one line per part, ending in `\n`).
    fn report(&self) -> (bool, String);
}

#[derive(Clone)]
struct AdminState<R> {
    registry: Arc<Registry>,
    readiness: R,
}

/// The admin endpoint's address could not be bound.
#[derive(Debug, thiserror::Error)]
#[error("binding the admin endpoint on {addr}")]
pub struct BindError {
    pub addr: SocketAddr,
    #[source]
    pub source: std::io::Error,
}

/// The admin routes.
pub fn router<R: ReadinessReport>(registry: Arc<Registry>, readiness: R) -> Router {
    Router::new()
        .route("/live", get(|| async { "live\n" }))
        .route("/ready", get(ready::<R>))
        .route("/metrics", get(metrics::<R>))
        .with_state(AdminState {
            registry,
            readiness,
        })
}

async fn ready<R: ReadinessReport>(State(s): State<AdminState<R>>) -> impl IntoResponse {
    let (ok, body) = s.readiness.report();
    let code = if ok {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (code, body)
}

async fn metrics<R: ReadinessReport>(State(s): State<AdminState<R>>) -> impl IntoResponse {
    (
        [(
            "content-type",
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        encode(&s.registry),
    )
}

/// The registry as OpenMetrics text (empty if encoding fails, which a registry of plain
/// metrics never does).
pub fn encode(registry: &Registry) -> String {
    let mut out = String::new();
    if prometheus_client::encoding::text::encode(&mut out, registry).is_err() {
        out.clear();
    }
    out
}

/// Binds the admin endpoint (a bind failure is returned, not logged away).
pub async fn bind(addr: SocketAddr) -> Result<tokio::net::TcpListener, BindError> {
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| BindError { addr, source })
}

/// Serves until `shutdown`.
pub async fn serve<R: ReadinessReport>(
    listener: tokio::net::TcpListener,
    registry: Arc<Registry>,
    readiness: R,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    if let Ok(addr) = listener.local_addr() {
        info!(%addr, "admin endpoint listening");
    }
    axum::serve(listener, router(registry, readiness))
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await
}
