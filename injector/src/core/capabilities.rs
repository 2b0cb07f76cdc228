//! `IPC_LOCK` on target containers: RDMA registers (pins) memory, which the default memlock
//! limit caps at a few MiB.
//!
//! Added once to `securityContext.capabilities.add` (also recognised as `CAP_IPC_LOCK`); never
//! to a privileged container, which has every capability already. Pod Security baseline and
//! restricted forbid it: see [`super::psa`].

use serde_json::{Value, json};

use super::Halt;
use super::names;
use super::patch::{Kind, PatchBuilder};
use super::pod::{ContainerView, malformed, non_null};

/// Adds `IPC_LOCK` unless present or privileged.
pub(crate) fn add_ipc_lock(
    builder: &mut PatchBuilder,
    container: &ContainerView<'_>,
) -> Result<(), Halt> {
    if container.privileged() {
        return Ok(());
    }
    if let Some(capabilities) = container.object_at(&["securityContext", "capabilities"])? {
        match non_null(capabilities.get("add")) {
            Some(Value::Array(added)) if added.iter().any(is_ipc_lock) => return Ok(()),
            None | Some(Value::Array(_)) => {}
            Some(other) => {
                return Err(malformed(
                    &format!("{}/securityContext/capabilities/add", container.pointer()),
                    "a list",
                    other,
                ));
            }
        }
    }
    let add = builder.ensure(
        &container.pointer(),
        &["securityContext", "capabilities", "add"],
        Kind::List,
    )?;
    builder.append(&add, json!(names::IPC_LOCK))
}

/// `IPC_LOCK` or `CAP_IPC_LOCK`.
pub(crate) fn is_ipc_lock(value: &Value) -> bool {
    value
        .as_str()
        .is_some_and(|cap| cap.strip_prefix("CAP_").unwrap_or(cap) == names::IPC_LOCK)
}
