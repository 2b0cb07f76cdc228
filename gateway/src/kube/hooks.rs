//! KubeVirt Plugin NodeHooks (`Plugins` feature gate, alpha, KubeVirt v1.9) as a trigger for
//! [`MigrationEvent::Started`]: the pure translation of one call. Served by
//! [`super::hooks_server`] (`--node-hooks-socket`); not run against a real KubeVirt yet.
//!
//! What is known (kubevirt/kubevirt `pkg/hooks/plugins/v1alpha1/api.proto`, `api.pb.go` and
//! `client.go`, read through the code search; see `research/kubevirt.md` §2.4): virt-handler
//! dials a plugin's unix socket and calls `kubevirt.hooks.plugins.v1alpha1.NodeHookService/
//! ExecuteNodeHook` with `ExecuteNodeHookRequest { string hookPoint = 1; bytes vmi = 2 (the VMI
//! as JSON); NodeContext node_context = 3 { string node_name = 1 } }`. Hook points include
//! `PreMigrationSource` (on the source after the migration proxy listeners exist and before
//! `MigrateVirtualMachine`, so the target's address and ports are already in the VMI) and
//! `PreMigrationTarget`. The stored versions disagree on the response: one declares an empty
//! `ExecuteNodeHookResponse`, a newer one `{ bool success = 1; string message = 2; }` that
//! `client.go` checks (a false `success` fails the hook). Our proto
//! (`gateway/proto/kubevirt/hooks/plugins/v1alpha1/nodehook.proto`) declares the newer shape and
//! the server always answers `success: true`, which the older decoders skip as unknown fields.
//!
//! [`event_for_hook`] reuses [`events_for`], as the VMI watch does, so both triggers build the
//! same [`crate::events::Migration`] for the same VMI and the core treats the second `Started`
//! as a no-op (tested below). The watch also delivers the `Ended`.
//!
//! `PreMigrationTarget` may run before the target virt-handler publishes its ports; then no
//! event is produced and the VMI watch starts the migration.

use crate::{
    events::{Migration, MigrationEvent, Role},
    kube::vmi::{VirtualMachineInstance, VmiView, events_for},
};

pub use super::hooks_api::{PRE_MIGRATION_SOURCE, PRE_MIGRATION_TARGET};

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
    #[error("hook call carries no readable VMI")]
    Vmi(#[from] serde_json::Error),
}

/// What a hook call starts on this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HookStart {
    /// The migration, as the VMI watch builds it for the same VMI.
    pub migration: Migration,
    /// The node the target runs on (`migrationState.targetNode`), for the peer directory.
    pub target_node: Option<String>,
}

/// The migration a hook call starts for the gateway on `call.node_name`, if any: only for the
/// two Pre-migration hook points, an opted-in VMI, this node in the matching role, and a target
/// address and ports already published. Every other call means nothing (`Ok(None)`).
pub fn event_for_hook(call: NodeHookCall<'_>) -> Result<Option<HookStart>, HookError> {
    let role = match call.hook_point {
        PRE_MIGRATION_SOURCE => Role::Source,
        PRE_MIGRATION_TARGET => Role::Target,
        _ => return Ok(None),
    };
    let vmi: VirtualMachineInstance = serde_json::from_slice(call.vmi)?;
    let view = VmiView::of(&vmi);
    let target_node = view.migration.as_ref().and_then(|m| m.target_node.clone());
    Ok(events_for(call.node_name, None, &view)
        .into_iter()
        .find_map(|e| match e {
            MigrationEvent::Started(m) if m.role == role => Some(m),
            _ => None,
        })
        .map(|migration| HookStart {
            migration,
            target_node,
        }))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::{Value, json};

    use super::*;
    use crate::{
        events::Handled,
        metrics::EndLabels,
        testing::{
            CountingLocator, RunningCore, core_with, migrating_vmi, migrating_vmi_migration, within,
        },
    };

    fn vmi(opted_in: bool, address: Option<&str>) -> Vec<u8> {
        serde_json::to_vec(&migrating_vmi(opted_in, address)).unwrap()
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
            Some(HookStart {
                migration: migrating_vmi_migration(role),
                target_node: Some("node-b".into()),
            })
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

    /// The VMI watch's view of a VMI as the API server delivers it.
    fn watched(vmi: &Value) -> VmiView {
        VmiView::of(&serde_json::from_value::<VirtualMachineInstance>(vmi.clone()).unwrap())
    }

    #[test]
    fn a_hook_started_migration_is_not_restarted_by_the_watch_and_the_watch_ends_it() {
        within(Duration::from_secs(10), hook_then_watch_body);
    }

    async fn hook_then_watch_body() {
        let ready = migrating_vmi(true, Some("10.244.2.7"));
        let bytes = serde_json::to_vec(&ready).unwrap();
        let from_hook = event_for_hook(call(PRE_MIGRATION_SOURCE, &bytes, "node-a"))
            .unwrap()
            .expect("the hook starts the migration")
            .migration;
        // The watch, seeing the same VMI for the first time, builds the equal event.
        let from_watch = events_for("node-a", None, &watched(&ready));
        let from_hook = MigrationEvent::Started(from_hook);
        assert_eq!(from_watch, vec![from_hook.clone()]);

        let locator = CountingLocator::default();
        let core = RunningCore::start(core_with(locator.clone()));
        let shared = core.shared.clone();
        let send = |event: MigrationEvent| core.send(event);

        // No capture namespace in a unit test: the capture is attempted (and fails) once.
        assert_eq!(send(from_hook).await, Handled::Uncaptured);
        assert_eq!(locator.calls(), 1);
        for event in from_watch {
            assert_eq!(send(event).await, Handled::AlreadyStarted);
        }
        assert_eq!(
            locator.calls(),
            1,
            "the watch's Started re-programmed the capture"
        );
        assert_eq!(shared.active(), 1);
        assert_eq!(shared.metrics.migrations_active.get(), 1);

        // The watch sees it complete and ends it.
        let mut done = ready.clone();
        done["status"]["migrationState"]["completed"] = json!(true);
        let ended = events_for("node-a", Some(&watched(&ready)), &watched(&done));
        assert_eq!(
            ended,
            vec![MigrationEvent::Ended {
                uid: "u1".into(),
                aborted: false,
                migration: Some("m1".into()),
            }]
        );
        for event in ended {
            assert_eq!(send(event).await, Handled::Ended);
        }
        assert_eq!(shared.active(), 0);
        let completed = shared
            .metrics
            .migrations_ended
            .get_or_create(&EndLabels {
                role: "source".into(),
                outcome: "completed".into(),
            })
            .get();
        assert_eq!(completed, 1);
        core.stop().await;
    }

    #[test]
    fn a_watch_a_whole_migration_behind_the_hooks_never_restarts_the_old_one() {
        within(Duration::from_secs(10), lagging_watch_body);
    }

    async fn lagging_watch_body() {
        let first = migrating_vmi(true, Some("10.244.2.7"));
        let mut second = first.clone();
        second["status"]["migrationState"]["migrationUid"] = json!("m2");
        let hook = |vmi: &Value| {
            let bytes = serde_json::to_vec(vmi).unwrap();
            let start = event_for_hook(call(PRE_MIGRATION_SOURCE, &bytes, "node-a"))
                .unwrap()
                .expect("the hook starts the migration");
            MigrationEvent::Started(start.migration)
        };

        let locator = CountingLocator::default();
        let core = RunningCore::start(core_with(locator.clone()));
        let shared = core.shared.clone();
        let send = |event: MigrationEvent| core.send(event);

        // The hooks start m1, then (m1 failed, KubeVirt retries) m2, which replaces it.
        assert_eq!(send(hook(&first)).await, Handled::Uncaptured);
        assert_eq!(send(hook(&second)).await, Handled::Uncaptured);
        assert_eq!(locator.calls(), 2);

        // Only now does the watch deliver what it saw: m1 starting, m1 failing, m2 starting.
        let mut failed = first.clone();
        failed["status"]["migrationState"]["completed"] = json!(true);
        failed["status"]["migrationState"]["failed"] = json!(true);
        let replay = [
            (events_for("node-a", None, &watched(&first)), Handled::Stale),
            (
                events_for("node-a", Some(&watched(&first)), &watched(&failed)),
                Handled::Ended,
            ),
            (
                events_for("node-a", Some(&watched(&failed)), &watched(&second)),
                Handled::AlreadyStarted,
            ),
        ];
        for (events, want) in replay {
            assert_eq!(events.len(), 1, "{events:?}");
            for event in events {
                assert_eq!(send(event.clone()).await, want, "{event:?}");
            }
        }
        assert_eq!(
            locator.calls(),
            2,
            "the watch's replay re-programmed a capture"
        );
        assert_eq!(shared.active(), 1, "m2 is still carried");
        let aborted = shared
            .metrics
            .migrations_ended
            .get_or_create(&EndLabels {
                role: "source".into(),
                outcome: "aborted".into(),
            })
            .get();
        assert_eq!(aborted, 1, "only m1 ended, when m2 replaced it");
        core.stop().await;
    }
}
