//! Generated gRPC types, server and client of KubeVirt's node hook API (from
//! `gateway/proto/kubevirt/hooks/plugins/v1alpha1/nodehook.proto`, built by `build.rs`), and the
//! hook point names.
//!
//! The client is only used by the tests (they play virt-handler).

/// `kubevirt.hooks.plugins.v1alpha1`: `NodeHookService/ExecuteNodeHook`.
pub mod v1alpha1 {
    #![allow(missing_docs, clippy::all, clippy::pedantic)]
    tonic::include_proto!("kubevirt.hooks.plugins.v1alpha1");
}

/// Hook point on the source node after virt-handler's migration proxy listens and before
/// QEMU's first connect.
pub const PRE_MIGRATION_SOURCE: &str = "PreMigrationSource";
/// Hook point on the target node before the migration starts.
pub const PRE_MIGRATION_TARGET: &str = "PreMigrationTarget";

/// Every node hook point a KubeVirt Plugin may name (the stored API versions together).
pub const HOOK_POINTS: [&str; 9] = [
    "PreVMStart",
    "PostVMStart",
    "PreVMStop",
    "OnVMStop",
    "PostVMStop",
    PRE_MIGRATION_SOURCE,
    "PostMigrationSource",
    PRE_MIGRATION_TARGET,
    "PostMigrationTarget",
];

/// `hook_point` as a metric label: itself if it is a known hook point, else `other` (the
/// label set stays bounded whatever a caller sends).
pub fn hook_label(hook_point: &str) -> &'static str {
    HOOK_POINTS
        .iter()
        .find(|known| **known == hook_point)
        .copied()
        .unwrap_or("other")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hook_labels_stay_bounded() {
        assert_eq!(hook_label("PreMigrationSource"), "PreMigrationSource");
        assert_eq!(hook_label("PostVMStop"), "PostVMStop");
        assert_eq!(hook_label("premigrationsource"), "other");
        assert_eq!(hook_label(""), "other");
    }
}
