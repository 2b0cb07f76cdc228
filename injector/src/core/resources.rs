//! The profile's extended resource: requests and limits, equal (the API server requires that
//! of extended resources), on the first target container, and only if no container (init
//! containers included) asks for it already. This never overwrites a user's value and never
//! doubles the count when a pod is planned again.

use json_patch::jsonptr::PointerBuf;
use serde_json::json;

use super::Halt;
use super::patch::{Kind, PatchBuilder};
use super::pod::PodView;
use crate::profile::ResourceSpec;

/// Adds the resource to container `target` unless the pod already requests it.
pub(crate) fn inject(
    builder: &mut PatchBuilder,
    pod: &PodView<'_>,
    resource: &ResourceSpec,
    target: usize,
    warnings: &mut Vec<String>,
) -> Result<(), Halt> {
    for container in pod.all_containers() {
        for section in ["requests", "limits"] {
            if let Some(map) = container.object_at(&["resources", section])?
                && map.contains_key(&resource.name)
            {
                if container.index != target || container.list != pod.containers[target].list {
                    warnings.push(format!(
                        "rdma-streams: container {:?} already requests {}; not added to {:?}",
                        container.name, resource.name, pod.containers[target].name
                    ));
                }
                return Ok(());
            }
        }
    }
    let base = pod.containers[target].pointer();
    let count = json!(resource.count.to_string());
    for section in ["requests", "limits"] {
        let map: PointerBuf = builder.ensure(&base, &["resources", section], Kind::Object)?;
        builder.add(
            map.with_trailing_token(resource.name.as_str()),
            count.clone(),
        )?;
    }
    Ok(())
}
