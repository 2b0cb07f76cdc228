//! KubeVirt virt-launcher pods.
//!
//! A VM opts in with `rdma-streams.io/migration: rdma` on its template; KubeVirt copies template
//! labels and annotations to the virt-launcher pod (label `kubevirt.io: virt-launcher`). The
//! launcher gets:
//! - the profile's RDMA resource on `compute` (the QEMU container), so the VM schedules, and
//!   live-migrates, only between RDMA nodes;
//! - the annotation `rdma-streams.io/migration: rdma`, which the migration gateway reads.
//!
//! Nothing else: QEMU and libvirt migrate over unix sockets and virt-handler's Go proxy (which
//! no LD_PRELOAD reaches) opens the node-to-node connections, so the shim, LD_PRELOAD and
//! IPC_LOCK would be dead weight in the launcher; KubeVirt writes the launcher's Multus
//! annotation and NAD resources itself. A launcher pod opted in the ordinary way (pod label,
//! namespace label) is treated the same: LD_PRELOAD never goes into virt-launcher.

use json_patch::jsonptr::PointerBuf;
use serde_json::json;

use super::names;
use super::patch::{Kind, PatchBuilder, annotation_pointer};
use super::pod::PodView;
use super::{DenyReason, Halt};

/// The target: `compute`.
pub(crate) fn targets(
    pod: &PodView<'_>,
    warnings: &mut Vec<String>,
) -> Result<Option<Vec<usize>>, Halt> {
    if pod.annotation(names::CONTAINERS_ANNOTATION).is_some() {
        warnings.push(format!(
            "rdma-streams: {} is ignored on virt-launcher pods; the RDMA resource goes to {:?}",
            names::CONTAINERS_ANNOTATION,
            names::COMPUTE_CONTAINER
        ));
    }
    match pod.container_index(names::COMPUTE_CONTAINER) {
        Some(index) => Ok(Some(vec![index])),
        None => Err(Halt::Deny(
            DenyReason::InvalidTarget,
            format!(
                "virt-launcher pod has no {:?} container to give the RDMA resource to",
                names::COMPUTE_CONTAINER
            ),
        )),
    }
}

/// Adds `rdma-streams.io/migration: rdma` unless present.
pub(crate) fn annotate(builder: &mut PatchBuilder, pod: &PodView<'_>) -> Result<(), Halt> {
    let label = pod.label(names::MIGRATION);
    let annotation = pod.annotation(names::MIGRATION);
    if let Some(value) = label
        .into_iter()
        .chain(annotation)
        .find(|v| *v != names::MIGRATION_RDMA)
    {
        return Err(Halt::Deny(
            DenyReason::BadAnnotation,
            format!(
                "{}={value:?} on the VM is not a known migration transport; use \"rdma\" or \
                 remove it",
                names::MIGRATION
            ),
        ));
    }
    if annotation.is_some() {
        return Ok(());
    }
    builder.ensure(
        &PointerBuf::root(),
        &["metadata", "annotations"],
        Kind::Object,
    )?;
    builder.add(
        annotation_pointer(names::MIGRATION),
        json!(names::MIGRATION_RDMA),
    )
}
