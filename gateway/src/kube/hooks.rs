//! KubeVirt Plugin NodeHooks (`Plugins` feature gate, alpha, KubeVirt v1.9) as a trigger for
//! [`MigrationEvent::Started`]. **Unverified against a real KubeVirt; not wired.**
//!
//! What is known (kubevirt/kubevirt `pkg/hooks/plugins/v1alpha1/api.proto` and `client.go`, read
//! through the code search; see `research/kubevirt.md` §2.4): virt-handler dials a plugin's unix
//! socket and calls `kubevirt.hooks.plugins.v1alpha1.NodeHookService/ExecuteNodeHook` with
//! `ExecuteNodeHookRequest { string hookPoint = 1; bytes vmi = 2 (the VMI as JSON);
//! NodeContext node_context = 3 { string node_name = 1 } }`. Hook points include
//! `PreMigrationSource` (on the source after the migration proxy listeners exist and before
//! `MigrateVirtualMachine`, so the target's address and ports are already in the VMI) and
//! `PreMigrationTarget`. The response message differs between the stored versions: the proto
//! read has an empty `ExecuteNodeHookResponse`, while a newer `client.go` reads
//! `resp.Success`/`resp.Message` and fails the hook when `Success` is false. So the response
//! shape (and hence a gRPC server) is not pinned down here; a server must answer with
//! success for every call (failure strategy `Fail` would otherwise block migrations).
//!
//! What this module gives: [`event_for_hook`], the pure translation of one call into at most
//! one `Started`, reusing [`events_for`]. Wiring it needs (1) a tonic server on the socket
//! named in the Plugin CR, built from the vendored proto once its response is confirmed, and
//! (2) de-duplication against the VMI watch, which will report the same migration moments later:
//! the data path must treat a `Started` equal to the one it already carries for that uid as a
//! no-op (or the two sources must share a "started" set).
//!
//! `PreMigrationTarget` may run before the target virt-handler publishes its ports; then no
//! event is produced and the VMI watch starts the migration.

use crate::{
    events::{MigrationEvent, Role},
    kube::vmi::{VirtualMachineInstance, VmiView, events_for},
};

/// Hook point on the source node before the migration starts.
pub const PRE_MIGRATION_SOURCE: &str = "PreMigrationSource";
/// Hook point on the target node before the migration starts.
pub const PRE_MIGRATION_TARGET: &str = "PreMigrationTarget";

/// One decoded `ExecuteNodeHookRequest`.
#[derive(Debug, Clone, Copy)]
pub struct NodeHookCall<'a> {
    /// `hookPoint`.
    pub hook_point: &'a str,
    /// `vmi`: the VirtualMachineInstance as JSON.
    pub vmi: &'a [u8],
    /// `node_context.node_name`.
    pub node_name: &'a str,
}

/// Why a hook call could not be read.
#[derive(Debug, thiserror::Error)]
pub enum HookError {
    /// The `vmi` bytes are not a VMI in JSON.
    #[error("hook call carries no readable VMI: {0}")]
    Vmi(#[from] serde_json::Error),
}

/// The `Started` event a hook call means for the gateway on `call.node_name`, if any: only for
/// the two Pre-migration hook points, an opted-in VMI, this node in the matching role, and a
/// target address and ports already published. Every other call means nothing (`Ok(None)`).
pub fn event_for_hook(call: NodeHookCall<'_>) -> Result<Option<MigrationEvent>, HookError> {
    let role = match call.hook_point {
        PRE_MIGRATION_SOURCE => Role::Source,
        PRE_MIGRATION_TARGET => Role::Target,
        _ => return Ok(None),
    };
    let vmi: VirtualMachineInstance = serde_json::from_slice(call.vmi)?;
    let view = VmiView::of(&vmi);
    Ok(events_for(call.node_name, None, &view)
        .into_iter()
        .find(|e| matches!(e, MigrationEvent::Started(m) if m.role == role)))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::events::Migration;

    fn vmi(opted_in: bool, address: Option<&str>) -> Vec<u8> {
        let labels = if opted_in {
            json!({ "rdma-streams.io/migration": "rdma" })
        } else {
            json!({})
        };
        serde_json::to_vec(&json!({
            "apiVersion": "kubevirt.io/v1",
            "kind": "VirtualMachineInstance",
            "metadata": { "name": "vm", "namespace": "ns", "uid": "u1", "labels": labels },
            "spec": {},
            "status": { "migrationState": {
                "migrationUid": "m1",
                "sourceNode": "node-a",
                "targetNode": "node-b",
                "targetNodeAddress": address,
                "targetDirectMigrationNodePorts": if address.is_some() { json!({ "40001": 0, "40000": 49152 }) } else { json!(null) },
            }},
        }))
        .unwrap()
    }

    fn call<'a>(hook_point: &'a str, vmi: &'a [u8], node_name: &'a str) -> NodeHookCall<'a> {
        NodeHookCall {
            hook_point,
            vmi,
            node_name,
        }
    }

    #[test]
    fn pre_migration_hooks_start_migrations() {
        let ready = vmi(true, Some("10.244.2.7"));
        let want = |role| {
            Some(MigrationEvent::Started(Migration {
                uid: "u1".into(),
                vmi: "ns/vm".into(),
                role,
                target: "10.244.2.7".parse().unwrap(),
                ports: vec![40000, 40001],
            }))
        };
        assert_eq!(
            event_for_hook(call(PRE_MIGRATION_SOURCE, &ready, "node-a")).unwrap(),
            want(Role::Source)
        );
        assert_eq!(
            event_for_hook(call(PRE_MIGRATION_TARGET, &ready, "node-b")).unwrap(),
            want(Role::Target)
        );
        // Wrong node for the hook point, other hook points, not opted in, not published.
        assert_eq!(
            event_for_hook(call(PRE_MIGRATION_SOURCE, &ready, "node-b")).unwrap(),
            None
        );
        assert_eq!(
            event_for_hook(call("PreVMStart", &ready, "node-a")).unwrap(),
            None
        );
        let opted_out = vmi(false, Some("10.244.2.7"));
        assert_eq!(
            event_for_hook(call(PRE_MIGRATION_SOURCE, &opted_out, "node-a")).unwrap(),
            None
        );
        let pending = vmi(true, None);
        assert_eq!(
            event_for_hook(call(PRE_MIGRATION_TARGET, &pending, "node-b")).unwrap(),
            None
        );
        assert!(event_for_hook(call(PRE_MIGRATION_SOURCE, b"not json", "node-a")).is_err());
    }
}
