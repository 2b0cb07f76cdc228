//! Fixed names: labels, annotations, volumes and containers (see the names table in the design).
//! The project's own labels and annotations come from the shared contract.

pub use rdma_streams_common::names::contract::{
    CONTAINERS_ANNOTATION, INJECT, INJECT_FALSE, INJECT_TRUE, MIGRATION, MIGRATION_RDMA,
    NAMESPACE_ENABLED, PROFILE_ANNOTATION, STATUS_ANNOTATION,
};

/// kubectl's default container annotation.
pub const DEFAULT_CONTAINER_ANNOTATION: &str = "kubectl.kubernetes.io/default-container";
/// Multus network selection annotation.
pub const MULTUS_NETWORKS: &str = "k8s.v1.cni.cncf.io/networks";
/// Pod Security Admission enforce level label on namespaces.
pub const PSA_ENFORCE: &str = "pod-security.kubernetes.io/enforce";
/// Pod Security Admission enforce version label on namespaces.
pub const PSA_ENFORCE_VERSION: &str = "pod-security.kubernetes.io/enforce-version";

/// KubeVirt's component label.
pub const KUBEVIRT_LABEL: &str = "kubevirt.io";
/// Its value on virt-launcher pods.
pub const VIRT_LAUNCHER: &str = "virt-launcher";
/// The QEMU container of a virt-launcher pod.
pub const COMPUTE_CONTAINER: &str = "compute";

/// The pod volume holding the shim bundle.
pub const SHIM_VOLUME: &str = "rdma-streams-shim";
/// The `init-copy` init container.
pub const SHIM_INIT_CONTAINER: &str = "rdma-streams-shim";
/// UID/GID the `init-copy` container runs as (the common distroless `nonroot` user).
pub const SHIM_INIT_UID: i64 = 65532;
/// The preload variable.
pub const LD_PRELOAD: &str = "LD_PRELOAD";
/// The capability RDMA memory registration needs beyond the default memlock limit.
pub const IPC_LOCK: &str = "IPC_LOCK";

/// Containers other injectors add; never targets. Matched by exact name.
pub const FOREIGN_INJECTED_CONTAINERS: &[&str] = &[
    // Istio
    "istio-proxy",
    "istio-init",
    "istio-validation",
    // Linkerd
    "linkerd-proxy",
    "linkerd-init",
    "linkerd-network-validator",
    "linkerd-debug",
    // Consul
    "consul-dataplane",
    "consul-connect-inject-init",
    "consul-connect-lifecycle-sidecar",
    "envoy-sidecar",
    // Kuma / Kong mesh
    "kuma-sidecar",
    "kuma-init",
    // Open Service Mesh (its proxy is plainly named "envoy", too generic to exclude)
    "osm-init",
    // Vault agent injector
    "vault-agent",
    "vault-agent-init",
    // Dapr
    "daprd",
    // ourselves
    SHIM_INIT_CONTAINER,
];

/// Whether another injector (or we) added this container.
pub fn is_foreign_injected(name: &str) -> bool {
    FOREIGN_INJECTED_CONTAINERS.contains(&name)
}
