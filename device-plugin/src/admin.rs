//! The admin endpoint: `/live`, `/ready` (every pool registered with kubelet), `/metrics`.

use std::{net::SocketAddr, sync::Arc};

use axum::{Router, extract::State, http::StatusCode, response::IntoResponse, routing::get};
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;
use tracing::info;

use crate::readiness::Readiness;

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
    let pools = s.readiness.snapshot();
    let body: String = pools
        .iter()
        .map(|(r, ok)| {
            format!(
                "{r} {}\n",
                if *ok { "registered" } else { "not registered" }
            )
        })
        .collect();
    let code = if s.readiness.is_ready() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (
        code,
        if body.is_empty() {
            "no pools\n".to_string()
        } else {
            body
        },
    )
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

/// Binds the admin endpoint (a bind failure is returned, not logged away).
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
