//! Prometheus metrics of the plugin (prometheus-client), served on `/metrics`.

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{
        counter::Counter,
        family::Family,
        gauge::Gauge,
        histogram::{Histogram, exponential_buckets},
    },
    registry::Registry,
};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResourceLabels {
    pub resource: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HealthLabels {
    pub resource: String,
    pub health: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    pub resource: String,
    pub result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HcaHealthLabels {
    pub health: String,
}

/// Every metric the plugin exports.
#[derive(Clone, Debug)]
pub struct Metrics {
    /// Advertised slots by resource and health.
    pub devices: Family<HealthLabels, Gauge>,
    /// Discovered HCAs by health.
    pub hcas: Family<HcaHealthLabels, Gauge>,
    /// Register / plugin-watcher registration outcomes.
    pub registrations: Family<ResultLabels, Counter>,
    /// kubelet restarts noticed (kubelet.sock created again, own socket removed).
    pub kubelet_restarts: Family<ResourceLabels, Counter>,
    /// Allocate calls by outcome.
    pub allocations: Family<ResultLabels, Counter>,
    pub allocate_seconds: Family<ResourceLabels, Histogram>,
    /// Open ListAndWatch streams.
    pub streams: Family<ResourceLabels, Gauge>,
    /// 1 while another instance on this node holds the pool's lock and serves it.
    pub standby: Family<ResourceLabels, Gauge>,
    /// 1 while the pool is registered with kubelet (removed with the pool).
    pub registered: Family<ResourceLabels, Gauge>,
    /// 1 while the kernel's RDMA netns mode is exclusive (shared slots do not work there).
    pub netns_exclusive: Gauge,
}

fn allocate_histogram() -> Histogram {
    // 10 us .. 164 ms.
    Histogram::new(exponential_buckets(0.000_01, 2.0, 15))
}

impl Metrics {
    /// New metrics registered under the `rdma_dp` prefix of `registry`.
    pub fn new(registry: &mut Registry) -> Self {
        let m = Self {
            devices: Family::default(),
            hcas: Family::default(),
            registrations: Family::default(),
            kubelet_restarts: Family::default(),
            allocations: Family::default(),
            allocate_seconds: Family::new_with_constructor(allocate_histogram),
            streams: Family::default(),
            standby: Family::default(),
            registered: Family::default(),
            netns_exclusive: Gauge::default(),
        };
        let r = registry.sub_registry_with_prefix("rdma_dp");
        r.register(
            "devices",
            "Advertised device slots by resource and health",
            m.devices.clone(),
        );
        r.register("hcas", "Discovered RDMA devices by health", m.hcas.clone());
        r.register(
            "registrations",
            "Registrations with kubelet by outcome",
            m.registrations.clone(),
        );
        r.register(
            "kubelet_restarts",
            "kubelet restarts noticed",
            m.kubelet_restarts.clone(),
        );
        r.register(
            "allocations",
            "Allocate calls by outcome",
            m.allocations.clone(),
        );
        r.register(
            "allocate_seconds",
            "Allocate latency",
            m.allocate_seconds.clone(),
        );
        r.register(
            "listandwatch_streams",
            "Open ListAndWatch streams",
            m.streams.clone(),
        );
        r.register(
            "standby",
            "1 while another instance on this node serves the pool",
            m.standby.clone(),
        );
        r.register(
            "registered",
            "1 while the pool is registered with kubelet",
            m.registered.clone(),
        );
        r.register(
            "netns_exclusive",
            "1 while the kernel's RDMA netns mode is exclusive",
            m.netns_exclusive.clone(),
        );
        m
    }

    pub fn resource(resource: &str) -> ResourceLabels {
        ResourceLabels {
            resource: resource.to_string(),
        }
    }

    pub fn result(resource: &str, result: &str) -> ResultLabels {
        ResultLabels {
            resource: resource.to_string(),
            result: result.to_string(),
        }
    }

    /// Records a pool's slot counts.
    pub fn set_devices(&self, resource: &str, healthy: usize, unhealthy: usize) {
        for (health, n) in [("Healthy", healthy), ("Unhealthy", unhealthy)] {
            self.devices
                .get_or_create(&HealthLabels {
                    resource: resource.to_string(),
                    health: health.to_string(),
                })
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
    }

    /// Removes a pool's gauges (pool removed from the config).
    pub fn forget_resource(&self, resource: &str) {
        for health in ["Healthy", "Unhealthy"] {
            self.devices.remove(&HealthLabels {
                resource: resource.to_string(),
                health: health.to_string(),
            });
        }
    }
}
