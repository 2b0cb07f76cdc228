//! Prometheus metrics of the admission server (prometheus-client).
//!
//! All handles are cheap clones of shared atomics: create them once, register them once, and
//! pass clones to whoever counts. Names below are relative to the registry they are registered
//! in; [`super::Server`] registers them under `rdma_stream_injector_`.
//!
//! | metric | labels | meaning |
//! | --- | --- | --- |
//! | `admission_requests_total` | `outcome` (`injected`, `skipped`, `denied`, `error`), `reason` | answered reviews |
//! | `admission_errors_total` | `kind` (`handler`, `panic`, `deadline`, `encode`) | reviews the handler did not decide |
//! | `admission_bad_requests_total` | `status` (`400`, `404`, `413`, `415`), `kind` | requests refused before the handler |
//! | `admission_duration_seconds` | | time from request head to response, handler included |
//! | `admission_in_flight` | | reviews being answered now |
//! | `tls_reloads_total` | | certificate pairs loaded after the first |
//! | `tls_reload_failures_total` | | new pairs on disk that did not load (the last good one stays) |
//! | `tls_cert_not_after_seconds` | | expiry of the serving certificate (Unix time) |

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{
        counter::Counter,
        family::Family,
        gauge::Gauge,
        histogram::{Histogram, exponential_buckets},
    },
    registry::{Registry, Unit},
};

/// Labels of `admission_requests_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// `injected`, `skipped`, `denied` or `error`.
    pub outcome: &'static str,
    /// The handler's reason, or the error kind.
    pub reason: &'static str,
}

/// Labels of `admission_errors_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    /// `handler`, `panic`, `deadline` or `encode`.
    pub kind: &'static str,
}

/// Labels of `admission_bad_requests_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BadRequestLabels {
    /// HTTP status answered (`400`, `404`, `413`, `415`).
    pub status: &'static str,
    /// What was wrong (`not-found`, `too-large`, `malformed`, `version`, `no-request`, ...).
    pub kind: &'static str,
}

/// Admission metrics.
#[derive(Clone, Debug)]
pub struct AdmissionMetrics {
    requests: Family<RequestLabels, Counter>,
    errors: Family<ErrorLabels, Counter>,
    bad_requests: Family<BadRequestLabels, Counter>,
    duration: Histogram,
    in_flight: Gauge,
}

/// TLS reload metrics, shared with [`super::tls::CertReloader`].
#[derive(Clone, Debug, Default)]
pub struct TlsMetrics {
    pub(crate) reloads: Counter,
    pub(crate) failures: Counter,
    pub(crate) not_after: Gauge,
}

// === impl AdmissionMetrics ===

impl Default for AdmissionMetrics {
    fn default() -> Self {
        Self {
            requests: Family::default(),
            errors: Family::default(),
            bad_requests: Family::default(),
            // 0.5 ms .. ~4 s: the goal is p99 <= 10 ms, the deadline is 4 s.
            duration: Histogram::new(exponential_buckets(0.0005, 2.0, 14)),
            in_flight: Gauge::default(),
        }
    }
}

impl AdmissionMetrics {
    /// Registers every admission metric in `registry`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "admission_requests",
            "AdmissionReviews answered, by outcome and reason",
            self.requests.clone(),
        );
        registry.register(
            "admission_errors",
            "AdmissionReviews the handler failed to decide, by kind",
            self.errors.clone(),
        );
        registry.register(
            "admission_bad_requests",
            "Requests refused before reaching the handler, by HTTP status and kind",
            self.bad_requests.clone(),
        );
        registry.register_with_unit(
            "admission_duration",
            "Time to answer an AdmissionReview",
            Unit::Seconds,
            self.duration.clone(),
        );
        registry.register(
            "admission_in_flight",
            "AdmissionReviews being answered",
            self.in_flight.clone(),
        );
    }

    pub(crate) fn answered(&self, outcome: &'static str, reason: &'static str) {
        self.requests
            .get_or_create(&RequestLabels { outcome, reason })
            .inc();
    }

    pub(crate) fn error(&self, kind: &'static str) {
        self.errors.get_or_create(&ErrorLabels { kind }).inc();
    }

    pub(crate) fn bad_request(&self, status: &'static str, kind: &'static str) {
        self.bad_requests
            .get_or_create(&BadRequestLabels { status, kind })
            .inc();
    }

    pub(crate) fn observe(&self, seconds: f64) {
        self.duration.observe(seconds);
    }

    /// Counts one review in flight until the guard drops.
    pub(crate) fn in_flight(&self) -> InFlight {
        self.in_flight.inc();
        InFlight(self.in_flight.clone())
    }

    /// Current value of `admission_requests_total{outcome, reason}`.
    #[cfg(test)]
    pub fn requests(&self, outcome: &'static str, reason: &'static str) -> u64 {
        self.requests
            .get_or_create(&RequestLabels { outcome, reason })
            .get()
    }

    /// Current value of `admission_errors_total{kind}`.
    #[cfg(test)]
    pub fn errors(&self, kind: &'static str) -> u64 {
        self.errors.get_or_create(&ErrorLabels { kind }).get()
    }

    /// Current value of `admission_bad_requests_total{status, kind}`.
    #[cfg(test)]
    pub fn bad_requests(&self, status: &'static str, kind: &'static str) -> u64 {
        self.bad_requests
            .get_or_create(&BadRequestLabels { status, kind })
            .get()
    }
}

/// Decrements `admission_in_flight` on drop.
#[derive(Debug)]
pub(crate) struct InFlight(Gauge);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.dec();
    }
}

// === impl TlsMetrics ===

impl TlsMetrics {
    /// Registers the TLS metrics in `registry`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "tls_reloads",
            "Serving certificate pairs loaded after the first",
            self.reloads.clone(),
        );
        registry.register(
            "tls_reload_failures",
            "New certificate pairs on disk that failed to load; the last good pair stays",
            self.failures.clone(),
        );
        registry.register_with_unit(
            "tls_cert_not_after",
            "Expiry of the serving certificate, Unix time",
            Unit::Seconds,
            self.not_after.clone(),
        );
    }
}
