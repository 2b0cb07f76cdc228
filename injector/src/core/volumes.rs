//! The shim bundle in the pod: a volume by delivery mode, the `init-copy` init container, and a
//! read-only mount in every target container.
//!
//! | delivery | pod volume | extra |
//! | --- | --- | --- |
//! | `image-volume` | `image: {reference}` (Kubernetes >= 1.33, ImageVolume) | - |
//! | `init-copy` | `emptyDir: {}` | init container `rdma-streams-shim` copies `/bundle/.` into it |
//! | `host-path` | `hostPath: {path, type: Directory}` (only under an allowed root) | - |
//!
//! Existing pieces are kept: a volume or init container already named `rdma-streams-shim`
//! (a second injector instance, a template injected offline) is not added twice, and a target
//! that already mounts something at the mount path gets no second mount (with a warning).

use serde_json::{Value, json};

use super::effective::Effective;
use super::names;
use super::patch::{Kind, PatchBuilder};
use super::pod::{ContainerView, PodView, non_null};
use super::{DenyReason, Halt};
use crate::profile::{ShimDelivery, ShimSpec};
use json_patch::jsonptr::PointerBuf;

/// CPU and memory of the init container, requests equal to limits: a Guaranteed pod stays
/// Guaranteed (every container, init ones included, must have equal requests and limits), and
/// namespaces with a ResourceQuota on cpu/memory accept it.
const INIT_CPU: &str = "100m";
const INIT_MEMORY: &str = "64Mi";

/// Adds the volume, the init container (init-copy) and the target mounts.
pub(crate) fn inject(
    builder: &mut PatchBuilder,
    pod: &PodView<'_>,
    effective: &Effective,
    targets: &[usize],
    warnings: &mut Vec<String>,
) -> Result<(), Halt> {
    let Some(shim) = effective.shim() else {
        return Ok(());
    };
    let spec = PointerBuf::from_tokens(["spec"]);

    let wanted = volume(shim);
    match pod
        .volumes()?
        .iter()
        .find(|v| v.get("name").and_then(Value::as_str) == Some(names::SHIM_VOLUME))
    {
        Some(existing) if *existing != wanted => warnings.push(format!(
            "rdma-streams: the pod already has a volume named {:?}; kept as is",
            names::SHIM_VOLUME
        )),
        Some(_) => {}
        None => {
            let volumes = builder.ensure(&spec, &["volumes"], Kind::List)?;
            builder.append(&volumes, wanted)?;
        }
    }

    if shim.delivery == ShimDelivery::InitCopy {
        if pod
            .containers
            .iter()
            .any(|c| c.name == names::SHIM_INIT_CONTAINER)
        {
            return Err(Halt::Deny(
                DenyReason::Conflict,
                format!(
                    "the pod has a container named {:?}, the name of the rdma-streams init \
                     container; rename it",
                    names::SHIM_INIT_CONTAINER
                ),
            ));
        }
        if !pod
            .init_containers
            .iter()
            .any(|c| c.name == names::SHIM_INIT_CONTAINER)
        {
            let init = builder.ensure(&spec, &["initContainers"], Kind::List)?;
            builder.append(&init, init_container(shim))?;
        }
    }

    for &index in targets {
        mount(builder, &pod.containers[index], shim, warnings)?;
    }
    Ok(())
}

fn mount(
    builder: &mut PatchBuilder,
    container: &ContainerView<'_>,
    shim: &ShimSpec,
    warnings: &mut Vec<String>,
) -> Result<(), Halt> {
    let mount_path = shim.mount_path.trim_end_matches('/');
    for existing in container.list("volumeMounts")? {
        if existing.get("name").and_then(Value::as_str) == Some(names::SHIM_VOLUME) {
            return Ok(());
        }
        let path = non_null(existing.get("mountPath")).and_then(Value::as_str);
        if path.map(|p| p.trim_end_matches('/')) == Some(mount_path) {
            warnings.push(format!(
                "rdma-streams: container {:?} already mounts something at {mount_path}; the shim \
                 is expected there, no second mount added",
                container.name
            ));
            return Ok(());
        }
    }
    let mounts = builder.ensure(&container.pointer(), &["volumeMounts"], Kind::List)?;
    builder.append(
        &mounts,
        json!({"name": names::SHIM_VOLUME, "mountPath": shim.mount_path, "readOnly": true}),
    )
}

/// The pod volume for a delivery mode.
fn volume(shim: &ShimSpec) -> Value {
    match shim.delivery {
        ShimDelivery::ImageVolume => {
            let mut image = json!({"reference": shim.image.as_deref().unwrap_or_default()});
            if let Some(policy) = shim.image_pull_policy {
                image["pullPolicy"] = json!(policy.as_str());
            }
            json!({"name": names::SHIM_VOLUME, "image": image})
        }
        ShimDelivery::InitCopy => json!({"name": names::SHIM_VOLUME, "emptyDir": {}}),
        ShimDelivery::HostPath => json!({
            "name": names::SHIM_VOLUME,
            "hostPath": {"path": shim.host_path.as_deref().unwrap_or_default(), "type": "Directory"},
        }),
    }
}

/// The init-copy container: restricted-compliant (non-root, no privilege escalation, every
/// capability dropped, RuntimeDefault seccomp, read-only root filesystem).
fn init_container(shim: &ShimSpec) -> Value {
    let mut container = json!({
        "name": names::SHIM_INIT_CONTAINER,
        "image": shim.image.as_deref().unwrap_or_default(),
        "command": shim.effective_init_command(),
        "volumeMounts": [{"name": names::SHIM_VOLUME, "mountPath": shim.mount_path}],
        "resources": {
            "requests": {"cpu": INIT_CPU, "memory": INIT_MEMORY},
            "limits": {"cpu": INIT_CPU, "memory": INIT_MEMORY},
        },
        "securityContext": {
            "runAsNonRoot": true,
            "runAsUser": names::SHIM_INIT_UID,
            "runAsGroup": names::SHIM_INIT_UID,
            "allowPrivilegeEscalation": false,
            "readOnlyRootFilesystem": true,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "terminationMessagePolicy": "FallbackToLogsOnError",
    });
    if let Some(policy) = shim.image_pull_policy {
        container["imagePullPolicy"] = json!(policy.as_str());
    }
    container
}
