//! Fixed names: labels, annotations, volumes and containers (see the names table in the design).

/// Pod label (objectSelector) or annotation (matchConditions) that opts a pod in (`"true"`) or
/// out (`"false"`); namespace label that opts every pod in (`"enabled"`).
pub const INJECT: &str = "rdma-streams.io/inject";
/// Pod opt-in value.
pub const INJECT_TRUE: &str = "true";
/// Pod opt-out value (wins over a namespace opt-in).
pub const INJECT_FALSE: &str = "false";
/// Namespace opt-in value.
pub const NAMESPACE_ENABLED: &str = "enabled";
/// Pod annotation naming the profile.
pub const PROFILE_ANNOTATION: &str = "rdma-streams.io/profile";
/// Pod annotation listing target containers (comma list).
pub const CONTAINERS_ANNOTATION: &str = "rdma-streams.io/containers";
/// Pod annotation the injector writes: JSON {version, profile, containers, hash}.
pub const STATUS_ANNOTATION: &str = "rdma-streams.io/status";
/// VM template label (propagated to the virt-launcher pod) opting a VM into RDMA migration, and
/// the annotation the injector writes on the launcher pod for the gateway.
pub const MIGRATION: &str = "rdma-streams.io/migration";
/// The only migration transport so far.
pub const MIGRATION_RDMA: &str = "rdma";

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
