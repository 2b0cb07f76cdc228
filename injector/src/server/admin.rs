//! The admin server (plain HTTP on `--admin-listen`): `/live`, `/ready`, `/metrics`.
//!
//! `/ready` is 200 only when the serving certificate is loaded, every [`ReadyGate`] handed out
//! by [`Readiness::gate`] is set (reflector caches synced, profiles loaded, ...) and the server
//! is not draining; otherwise 503 with the list of what is missing. `/live` is 200 as long as
//! the process answers.

use std::sync::{
    Arc, Mutex,
    atomic::{AtomicBool, Ordering},
};

use axum::{Router, body::Body, extract::State, response::Response, routing::get};
use http::{StatusCode, header};
use prometheus_client::registry::Registry;
use rdma_streams_common::report::Report;

use super::tls::CertReloader;

/// Readiness conditions supplied from outside the server.
///
/// Cloning shares the same conditions. With no gates it is ready (the benchmark case).
#[derive(Clone, Debug, Default)]
pub struct Readiness {
    gates: Arc<Mutex<Vec<Gate>>>,
    draining: Arc<AtomicBool>,
}

/// A named condition in a [`Readiness`].
type Gate = (&'static str, Arc<AtomicBool>);

/// One readiness condition; starts not ready.
#[derive(Clone, Debug)]
pub struct ReadyGate(Arc<AtomicBool>);

/// What the admin router reads.
#[derive(Clone, Debug)]
pub struct AdminState {
    /// External conditions.
    pub readiness: Readiness,
    /// The serving certificate; `None` means not loaded yet.
    pub tls: Option<Arc<CertReloader>>,
    /// Everything `/metrics` exposes.
    pub registry: Arc<Registry>,
}

// === impl Readiness ===

impl Readiness {
    /// No conditions, not draining.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a condition named `name` (shown by `/ready` while unset), initially not ready.
    pub fn gate(&self, name: &'static str) -> ReadyGate {
        let flag = Arc::new(AtomicBool::new(false));
        self.lock().push((name, flag.clone()));
        ReadyGate(flag)
    }

    /// Makes `/ready` fail from now on, so endpoints stop routing here during shutdown.
    pub fn drain(&self) {
        self.draining.store(true, Ordering::Release);
    }

    /// Whether shutdown has begun.
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    /// Names of the conditions not yet ready.
    pub fn pending(&self) -> Vec<&'static str> {
        self.lock()
            .iter()
            .filter(|(_, flag)| !flag.load(Ordering::Acquire))
            .map(|(name, _)| *name)
            .collect()
    }

    /// All conditions ready and not draining.
    pub fn is_ready(&self) -> bool {
        !self.is_draining() && self.pending().is_empty()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Gate>> {
        // Entries are only ever pushed whole; a poisoned list is still consistent.
        self.gates
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

// === impl ReadyGate ===

impl ReadyGate {
    /// Marks the condition ready (or not ready again).
    pub fn set(&self, ready: bool) {
        self.0.store(ready, Ordering::Release);
    }

    /// Whether the condition is ready.
    pub fn get(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

/// The admin router.
pub fn router(state: AdminState) -> Router {
    Router::new()
        .route("/live", get(live))
        .route("/ready", get(ready))
        .route("/metrics", get(metrics))
        .with_state(state)
}

async fn live() -> Response {
    text(
        StatusCode::OK,
        "live\n".to_owned(),
        "text/plain; charset=utf-8",
    )
}

async fn ready(State(state): State<AdminState>) -> Response {
    let mut missing: Vec<String> = Vec::new();
    if state.readiness.is_draining() {
        missing.push("draining".to_owned());
    }
    let serial = match &state.tls {
        Some(tls) => tls.state().serial,
        None => {
            missing.push("tls certificate".to_owned());
            None
        }
    };
    missing.extend(state.readiness.pending().into_iter().map(str::to_owned));
    if missing.is_empty() {
        let serial = serial.unwrap_or_else(|| "?".to_owned());
        let body = format!("ready (certificate serial {serial})\n");
        text(StatusCode::OK, body, "text/plain; charset=utf-8")
    } else {
        let body = format!("not ready: {}\n", missing.join(", "));
        text(
            StatusCode::SERVICE_UNAVAILABLE,
            body,
            "text/plain; charset=utf-8",
        )
    }
}

async fn metrics(State(state): State<AdminState>) -> Response {
    let mut body = String::new();
    match prometheus_client::encoding::text::encode(&mut body, &state.registry) {
        Ok(()) => text(
            StatusCode::OK,
            body,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        ),
        Err(error) => {
            tracing::error!(error = %Report(&error), "cannot encode metrics");
            text(
                StatusCode::INTERNAL_SERVER_ERROR,
                "cannot encode metrics\n".to_owned(),
                "text/plain; charset=utf-8",
            )
        }
    }
}

fn text(status: StatusCode, body: String, content_type: &'static str) -> Response {
    let mut response = Response::new(Body::from(body));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(content_type),
    );
    response
}
