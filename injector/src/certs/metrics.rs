//! Metrics of the self-managed CA (registered under the injector's prefix):
//!
//! | name | type | meaning |
//! | --- | --- | --- |
//! | `ca_not_after_seconds` | gauge | expiry of the CA in use (Unix time; 0 unknown) |
//! | `ca_changes_total` | counter | new CAs taken from the CA Secret since start |

use prometheus_client::{
    metrics::{counter::Counter, gauge::Gauge},
    registry::{Registry, Unit},
};

use super::CertAuthority;
use crate::server::x509;

/// See the module docs; cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct CaMetrics {
    not_after: Gauge,
    changes: Counter,
}

impl CaMetrics {
    /// Registers the metrics in `registry` (the caller adds the prefix).
    pub fn register(&self, registry: &mut Registry) {
        registry.register_with_unit(
            "ca_not_after",
            "Expiry of the self-managed CA in use, Unix time",
            Unit::Seconds,
            self.not_after.clone(),
        );
        registry.register(
            "ca_changes",
            "New CAs taken from the CA Secret since start",
            self.changes.clone(),
        );
    }

    /// Records the CA in use (at start).
    pub fn in_use(&self, ca: &CertAuthority) {
        let not_after = x509::summarize_pem(ca.cert_pem()).not_after;
        self.not_after.set(not_after.unwrap_or_default());
    }

    /// Records a new CA taken from the Secret.
    pub fn changed(&self, ca: &CertAuthority) {
        self.changes.inc();
        self.in_use(ca);
    }

    #[cfg(test)]
    pub fn changes(&self) -> u64 {
        self.changes.get()
    }

    #[cfg(test)]
    pub fn not_after(&self) -> i64 {
        self.not_after.get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ca_in_use_and_its_changes_are_recorded() {
        let metrics = CaMetrics::default();
        let ca = CertAuthority::generate().unwrap();
        metrics.in_use(&ca);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64;
        let ten_years = 10 * 365 * 24 * 3600;
        assert!(
            (metrics.not_after() - now - ten_years).abs() < 60,
            "{}",
            metrics.not_after()
        );
        assert_eq!(metrics.changes(), 0);
        metrics.changed(&CertAuthority::generate().unwrap());
        assert_eq!(metrics.changes(), 1);
        let mut registry = Registry::default();
        metrics.register(registry.sub_registry_with_prefix("rdma_stream_injector"));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            text.contains("rdma_stream_injector_ca_not_after_seconds "),
            "{text}"
        );
        assert!(
            text.contains("rdma_stream_injector_ca_changes_total 1"),
            "{text}"
        );
    }
}
