//! The one admin endpoint every long-running binary serves: `/live`, `/ready`, `/metrics`
//! (OpenMetrics text of a `prometheus-client` registry), on its own listener. The
//! [`crate::runtime`] starts it before anything else and stops it last.
//!
//! `/ready` is the [`Readiness`] of the process: named gates that its components register
//! ([`Readiness::gate`], [`Readiness::check`]), each not ready until its component says so, and
//! a draining flag the runtime raises first on shutdown, so that endpoints stop routing here
//! while the process still serves. The body names what is missing:
//!
//! ```text
//! 200 ready                                   503 not ready: draining, namespace cache
//!     rdma-streams.io/hca registered              rdma-streams.io/hca not registered
//! ```
//!
//! The first line is `ready`, or `not ready:` with the names of the gates not ready (`draining`
//! first while draining); a line `<gate> <note>` follows for each gate that has a note.

use std::{
    net::SocketAddr,
    sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError},
};

use axum::{Router, extract::State, http::StatusCode, response::IntoResponse, routing::get};
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;
use tracing::info;

/// What `/ready` reports: the named gates of the process and whether it is draining.
///
/// Cloning shares the gates. With no gates and not draining it is ready.
#[derive(Clone, Default)]
pub struct Readiness {
    inner: Arc<Mutex<Gates>>,
}

/// A gate's state, as a component reports it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Status {
    pub ready: bool,
    /// Shown on `/ready` after the gate's name, ready or not (`registered`, `serial 03e9`).
    pub note: Option<String>,
}

/// A named readiness condition, set by the component that registered it (not ready at first).
///
/// Clones set the same gate. The gate stays until [`Gate::remove`].
#[derive(Clone)]
pub struct Gate {
    readiness: Readiness,
    id: u64,
}

/// A closure asked for its status at every `/ready`.
type Check = Arc<dyn Fn() -> Status + Send + Sync>;

#[derive(Default)]
struct Gates {
    draining: bool,
    next_id: u64,
    entries: Vec<Entry>,
}

struct Entry {
    id: u64,
    name: String,
    probe: Probe,
}

enum Probe {
    Set(Status),
    Check(Check),
}

/// `/metrics`: the registry a binary publishes once its metrics are registered (an empty
/// exposition until then).
#[derive(Clone, Default)]
pub struct MetricsEndpoint {
    registry: Arc<OnceLock<Registry>>,
}

/// The admin endpoint's address could not be bound.
#[derive(Debug, thiserror::Error)]
#[error("binding the admin endpoint on {addr}")]
pub struct BindError {
    pub addr: SocketAddr,
    #[source]
    pub source: std::io::Error,
}

// === impl Readiness ===

impl Readiness {
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers the gate `name`, not ready until [`Gate::set`] says so.
    pub fn gate(&self, name: impl Into<String>) -> Gate {
        let id = self.push(name.into(), Probe::Set(Status::default()));
        Gate {
            readiness: self.clone(),
            id,
        }
    }

    /// Registers the gate `name` whose status `check` reports when `/ready` is asked (for a
    /// state another component already keeps, such as the certificate in use).
    pub fn check(
        &self,
        name: impl Into<String>,
        check: impl Fn() -> Status + Send + Sync + 'static,
    ) {
        self.push(name.into(), Probe::Check(Arc::new(check)));
    }

    /// `/ready` fails from now on: shutdown has begun.
    pub fn drain(&self) {
        self.lock().draining = true;
    }

    pub fn is_draining(&self) -> bool {
        self.lock().draining
    }

    /// Whether every gate is ready and the process is not draining.
    pub fn is_ready(&self) -> bool {
        self.report().0
    }

    /// The names of what is not ready: `draining` first, then the gates not ready.
    pub fn not_ready(&self) -> Vec<String> {
        let (draining, statuses) = self.statuses();
        draining
            .then(|| "draining".to_owned())
            .into_iter()
            .chain(
                statuses
                    .into_iter()
                    .filter(|(_, s)| !s.ready)
                    .map(|(name, _)| name),
            )
            .collect()
    }

    /// Ready or not, and the `/ready` body (see the module doc).
    pub fn report(&self) -> (bool, String) {
        let (draining, statuses) = self.statuses();
        let missing: Vec<&str> = draining
            .then_some("draining")
            .into_iter()
            .chain(
                statuses
                    .iter()
                    .filter(|(_, s)| !s.ready)
                    .map(|(name, _)| name.as_str()),
            )
            .collect();
        let mut body = if missing.is_empty() {
            "ready\n".to_owned()
        } else {
            format!("not ready: {}\n", missing.join(", "))
        };
        for (name, status) in &statuses {
            if let Some(note) = &status.note {
                body.push_str(&format!("{name} {note}\n"));
            }
        }
        (missing.is_empty(), body)
    }

    /// The draining flag and each gate's status, in registration order (checks run outside
    /// the lock: a check may read another `Readiness`).
    fn statuses(&self) -> (bool, Vec<(String, Status)>) {
        enum Got {
            Now(Status),
            Later(Check),
        }
        let (draining, got): (bool, Vec<(String, Got)>) = {
            let gates = self.lock();
            let got = gates
                .entries
                .iter()
                .map(|e| {
                    let got = match &e.probe {
                        Probe::Set(status) => Got::Now(status.clone()),
                        Probe::Check(check) => Got::Later(check.clone()),
                    };
                    (e.name.clone(), got)
                })
                .collect();
            (gates.draining, got)
        };
        let statuses = got
            .into_iter()
            .map(|(name, got)| match got {
                Got::Now(status) => (name, status),
                Got::Later(check) => (name, check()),
            })
            .collect();
        (draining, statuses)
    }

    fn push(&self, name: String, probe: Probe) -> u64 {
        let mut gates = self.lock();
        let id = gates.next_id;
        gates.next_id += 1;
        gates.entries.push(Entry { id, name, probe });
        id
    }

    fn lock(&self) -> MutexGuard<'_, Gates> {
        // Every change is a single assignment or push: a poisoned lock still holds a
        // consistent list.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl std::fmt::Debug for Readiness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (draining, statuses) = self.statuses();
        f.debug_struct("Readiness")
            .field("draining", &draining)
            .field("gates", &statuses)
            .finish()
    }
}

// === impl Status ===

impl Status {
    pub fn ready() -> Self {
        Self {
            ready: true,
            note: None,
        }
    }

    pub fn not_ready() -> Self {
        Self::default()
    }

    /// The same status with `note` shown after the gate's name.
    pub fn with_note(mut self, note: impl Into<String>) -> Self {
        self.note = Some(note.into());
        self
    }
}

// === impl Gate ===

impl Gate {
    /// Ready or not; the note stays.
    pub fn set(&self, ready: bool) {
        self.update(|status| status.ready = ready);
    }

    /// Ready or not, with the note shown after the gate's name on `/ready`.
    pub fn set_with_note(&self, ready: bool, note: impl Into<String>) {
        let note = note.into();
        self.update(|status| {
            status.ready = ready;
            status.note = Some(note);
        });
    }

    pub fn is_ready(&self) -> bool {
        let gates = self.readiness.lock();
        gates
            .entries
            .iter()
            .any(|e| e.id == self.id && matches!(&e.probe, Probe::Set(status) if status.ready))
    }

    /// Takes the gate away (its component is gone); `/ready` no longer waits for it.
    pub fn remove(self) {
        self.readiness.lock().entries.retain(|e| e.id != self.id);
    }

    fn update(&self, f: impl FnOnce(&mut Status)) {
        let mut gates = self.readiness.lock();
        if let Some(Entry {
            probe: Probe::Set(status),
            ..
        }) = gates.entries.iter_mut().find(|e| e.id == self.id)
        {
            f(status);
        }
    }
}

impl std::fmt::Debug for Gate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gate").field("id", &self.id).finish()
    }
}

// === impl MetricsEndpoint ===

impl MetricsEndpoint {
    pub fn new() -> Self {
        Self::default()
    }

    /// Serves `registry` on `/metrics` from now on. Only the first registry published is
    /// served; a second one is handed back.
    pub fn publish(&self, registry: Registry) -> Result<(), Registry> {
        self.registry.set(registry)
    }

    /// The published registry as OpenMetrics text (`# EOF` alone before one is published).
    pub fn encode(&self) -> String {
        match self.registry.get() {
            Some(registry) => encode(registry),
            None => encode(&Registry::default()),
        }
    }
}

impl std::fmt::Debug for MetricsEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetricsEndpoint")
            .field("published", &self.registry.get().is_some())
            .finish()
    }
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

// === the server ===

#[derive(Clone)]
struct AdminState {
    metrics: MetricsEndpoint,
    readiness: Readiness,
}

/// The admin routes.
pub fn router(metrics: MetricsEndpoint, readiness: Readiness) -> Router {
    Router::new()
        .route("/live", get(|| async { "live\n" }))
        .route("/ready", get(ready))
        .route("/metrics", get(metrics_text))
        .with_state(AdminState { metrics, readiness })
}

async fn ready(State(s): State<AdminState>) -> impl IntoResponse {
    let (ok, body) = s.readiness.report();
    let code = if ok {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (code, body)
}

async fn metrics_text(State(s): State<AdminState>) -> impl IntoResponse {
    (
        [(
            "content-type",
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        s.metrics.encode(),
    )
}

/// Binds the admin endpoint (a bind failure is returned, not logged away).
pub async fn bind(addr: SocketAddr) -> Result<tokio::net::TcpListener, BindError> {
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| BindError { addr, source })
}

/// Serves until `stop`, then finishes the requests in flight.
pub async fn serve(
    listener: tokio::net::TcpListener,
    metrics: MetricsEndpoint,
    readiness: Readiness,
    stop: CancellationToken,
) -> std::io::Result<()> {
    if let Ok(addr) = listener.local_addr() {
        info!(%addr, "admin endpoint listening");
    }
    axum::serve(listener, router(metrics, readiness))
        .with_graceful_shutdown(async move { stop.cancelled().await })
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_gates_is_ready() {
        let r = Readiness::new();
        assert_eq!(r.report(), (true, "ready\n".to_owned()));
        assert!(r.not_ready().is_empty());
    }

    #[test]
    fn gates_start_not_ready_and_are_named_until_set() {
        let r = Readiness::new();
        let cache = r.gate("namespace cache");
        let tls = r.gate("tls certificate");
        assert_eq!(
            r.report(),
            (
                false,
                "not ready: namespace cache, tls certificate\n".to_owned()
            )
        );
        tls.set(true);
        assert_eq!(r.not_ready(), ["namespace cache"]);
        assert!(tls.is_ready() && !cache.is_ready());
        cache.clone().set(true);
        assert!(r.is_ready());
        cache.set(false);
        assert_eq!(r.not_ready(), ["namespace cache"]);
        cache.remove();
        assert!(r.is_ready());
    }

    #[test]
    fn notes_follow_the_first_line() {
        let r = Readiness::new();
        let a = r.gate("rdma-streams.io/hca");
        let b = r.gate("rdma-streams.io/roce");
        a.set_with_note(true, "registered");
        b.set_with_note(false, "not registered");
        assert_eq!(
            r.report(),
            (
                false,
                "not ready: rdma-streams.io/roce\n\
                 rdma-streams.io/hca registered\n\
                 rdma-streams.io/roce not registered\n"
                    .to_owned()
            )
        );
        b.set_with_note(true, "standby");
        assert_eq!(
            r.report().1,
            "ready\nrdma-streams.io/hca registered\nrdma-streams.io/roce standby\n"
        );
    }

    #[test]
    fn checks_are_asked_at_each_report() {
        let r = Readiness::new();
        let serial = Arc::new(Mutex::new(None::<String>));
        {
            let serial = serial.clone();
            r.check("tls certificate", move || {
                match serial.lock().unwrap().clone() {
                    Some(s) => Status::ready().with_note(format!("serial {s}")),
                    None => Status::not_ready(),
                }
            });
        }
        assert_eq!(r.not_ready(), ["tls certificate"]);
        *serial.lock().unwrap() = Some("03e9".into());
        assert_eq!(
            r.report(),
            (true, "ready\ntls certificate serial 03e9\n".into())
        );
    }

    #[test]
    fn draining_fails_first() {
        let r = Readiness::new();
        let gate = r.gate("cache");
        r.drain();
        assert!(r.is_draining());
        assert_eq!(r.report().1, "not ready: draining, cache\n");
        gate.set(true);
        assert_eq!(r.report(), (false, "not ready: draining\n".into()));
    }

    #[test]
    fn metrics_are_empty_until_published() {
        let m = MetricsEndpoint::new();
        assert_eq!(m.encode(), "# EOF\n");
        let mut registry = Registry::default();
        let c = prometheus_client::metrics::counter::Counter::<u64>::default();
        registry.register("things", "Things", c.clone());
        c.inc();
        assert!(m.publish(registry).is_ok());
        assert!(m.encode().contains("things_total 1"), "{}", m.encode());
        assert!(m.publish(Registry::default()).is_err());
    }
}
