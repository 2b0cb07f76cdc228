//! Which migrations this node must carry, from a watch on `kubevirt.io/v1`
//! VirtualMachineInstances.
//!
//! **What is watched.** Only opted-in VMIs: the label selector
//! `rdma-streams.io/migration=rdma` (the label sits on the VM template, so KubeVirt copies it
//! to the VMI). Nothing narrower is safe:
//! - Field selectors on custom resources only support `metadata.name`/`metadata.namespace`
//!   (KubeVirt's VMI CRD declares no `selectableFields`), so `status.migrationState.*` cannot
//!   be selected server-side.
//! - KubeVirt's node labels on VMIs (`kubevirt.io/nodeName`,
//!   `kubevirt.io/migrationTargetNodeName`, which exist because CRDs have no field selectors)
//!   move when a migration completes; a watch selecting on them sees the VMI leave as a
//!   `DELETED` event carrying the *previous* content (before `completed`), so a successful
//!   migration would look aborted on the source, and one label selector cannot OR the two
//!   labels (two watches would be needed). With only the opt-in label a `DELETED` means the VMI
//!   is really gone (or opted out).
//!
//! Each gateway therefore sees every opted-in VMI of the cluster and keeps the ones whose
//! `status.migrationState.sourceNode` or `targetNode` is its node. Only a few small fields are
//! deserialized (no spec), so the memory cost is a few hundred bytes per opted-in VMI.
//!
//! **When events fire** ([`events_for`], a pure function of the previous and the new view):
//! `Started` once per migration (`migrationUid`), as soon as the migration involves this node
//! and the target virt-handler has published `targetNodeAddress` and
//! `targetDirectMigrationNodePorts`; `Ended` once when it completed (`aborted: false`), failed,
//! was aborted (`abortStatus: Succeeded`), the VMI was deleted or opted out mid-flight, or a
//! new migration of the same VMI replaced it (`aborted: true` for all of these). Re-syncs of the
//! same state emit nothing. `abortStatus: Aborting` or `Failed` (an abort that failed; the
//! migration goes on) end nothing by themselves.
//!
//! **Runner.** [`watch_migrations`] reads a [`Watch`] (kube-runtime's watcher with kube's
//! default backoff: errors are logged and retried, a `410 Gone` relists) and after a relist
//! ends the migrations of VMIs that disappeared meanwhile. It stops when the shutdown token is
//! cancelled or the receiver is dropped.

use std::{
    borrow::Cow,
    collections::{BTreeMap, HashMap, HashSet},
    net::IpAddr,
};

use futures::StreamExt;
use k8s_openapi::{NamespaceResourceScope, apimachinery::pkg::apis::meta::v1::ObjectMeta};
use kube::{
    Api, Client, Resource,
    runtime::watcher::{self, Event},
};
use rdma_streams_common::names::contract::{MIGRATION, MIGRATION_RDMA};
use rdma_streams_common::{kube::Watch, report::Report};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::node::NodePeerDirectory;
use crate::events::{EventDelivery, Migration, MigrationEvent, Role};

/// `status.migrationState.abortStatus` once an abort took effect.
const ABORT_SUCCEEDED: &str = "Succeeded";

// === kubevirt.io/v1 VirtualMachineInstance, only what we read ===

/// A `kubevirt.io/v1` VirtualMachineInstance reduced to what the gateway reads. Every field is
/// optional and unknown fields are ignored; a `migrationState` of an unexpected shape is logged
/// and read as absent, so no VMI can break the watch.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(default)]
pub struct VirtualMachineInstance {
    pub metadata: ObjectMeta,
    pub status: VmiStatus,
}

/// `status` of a VMI, reduced.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(default, rename_all = "camelCase")]
pub struct VmiStatus {
    #[serde(deserialize_with = "lenient", skip_serializing_if = "Option::is_none")]
    pub migration_state: Option<VmiMigrationState>,
}

/// `status.migrationState` of a VMI, reduced (KubeVirt `VirtualMachineInstanceMigrationState`).
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase")]
pub struct VmiMigrationState {
    pub migration_uid: Option<String>,
    pub source_node: Option<String>,
    pub target_node: Option<String>,
    pub target_node_address: Option<String>,
    /// Random target port (as a string) -> 0, 49152 or 49153 (which socket it stands for).
    pub target_direct_migration_node_ports: Option<BTreeMap<String, Value>>,
    pub completed: Option<bool>,
    pub failed: Option<bool>,
    pub abort_status: Option<String>,
    pub start_timestamp: Option<String>,
    pub end_timestamp: Option<String>,
}

/// Reads an optional value, logging and dropping it if it does not have the expected shape.
fn lenient<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: serde::de::DeserializeOwned,
{
    let raw = Option::<Value>::deserialize(deserializer)?;
    match raw {
        None | Some(Value::Null) => Ok(None),
        Some(value) => match serde_json::from_value(value) {
            Ok(parsed) => Ok(Some(parsed)),
            Err(error) => {
                warn!(error = %Report(&error), "ignoring a VMI migrationState of unexpected shape");
                Ok(None)
            }
        },
    }
}

impl Resource for VirtualMachineInstance {
    type DynamicType = ();
    type Scope = NamespaceResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        "VirtualMachineInstance".into()
    }
    fn group(_: &()) -> Cow<'_, str> {
        "kubevirt.io".into()
    }
    fn version(_: &()) -> Cow<'_, str> {
        "v1".into()
    }
    fn plural(_: &()) -> Cow<'_, str> {
        "virtualmachineinstances".into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

// === VmiView ===

/// What [`events_for`] needs to know about one VMI.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VmiView {
    pub uid: String,
    pub namespace: String,
    pub name: String,
    /// Carries `rdma-streams.io/migration: rdma`.
    pub opted_in: bool,
    /// The watch reported it deleted (or it vanished across a relist); its last known state.
    pub deleted: bool,
    pub migration: Option<VmiMigrationState>,
}

impl VmiView {
    /// The view of `vmi` as the watch delivered it.
    pub fn of(vmi: &VirtualMachineInstance) -> Self {
        let meta = &vmi.metadata;
        Self {
            uid: meta.uid.clone().unwrap_or_default(),
            namespace: meta.namespace.clone().unwrap_or_default(),
            name: meta.name.clone().unwrap_or_default(),
            opted_in: meta
                .labels
                .as_ref()
                .and_then(|l| l.get(MIGRATION))
                .is_some_and(|v| v == MIGRATION_RDMA),
            deleted: false,
            migration: vmi.status.migration_state.clone(),
        }
    }

    /// This view, marked deleted.
    pub fn into_deleted(mut self) -> Self {
        self.deleted = true;
        self
    }

    fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// Where one VMI's migration stands, seen from `node`.
#[derive(Debug, PartialEq, Eq)]
enum Stage {
    /// No migration of this VMI concerns this node (or not opted in, or deleted mid-flight).
    None,
    /// Concerns this node, target address/ports not published yet.
    Pending { id: String },
    /// Concerns this node and can be carried.
    Ready { migration: Migration },
    /// Concerns this node and is over.
    Over { id: String, aborted: bool },
    /// Concerns this node but what the target published cannot be read.
    Malformed { id: String, why: String },
}

impl Stage {
    fn id(&self) -> Option<&str> {
        match self {
            Stage::None => None,
            Stage::Ready { migration } => Some(&migration.id),
            Stage::Pending { id } | Stage::Over { id, .. } | Stage::Malformed { id, .. } => {
                Some(id)
            }
        }
    }
}

fn stage(node: &str, view: &VmiView) -> Stage {
    let Some(state) = view.migration.as_ref().filter(|_| view.opted_in) else {
        return Stage::None;
    };
    let role = if state.source_node.as_deref() == Some(node) {
        Role::Source
    } else if state.target_node.as_deref() == Some(node) {
        Role::Target
    } else {
        return Stage::None;
    };
    // Without a migrationUid (older KubeVirt) the start time tells migrations apart.
    let id = state
        .migration_uid
        .clone()
        .or_else(|| state.start_timestamp.clone())
        .unwrap_or_default();
    let completed = state.completed == Some(true);
    if completed
        || state.failed == Some(true)
        || state.abort_status.as_deref() == Some(ABORT_SUCCEEDED)
    {
        return Stage::Over {
            id,
            aborted: !completed,
        };
    }
    if view.deleted {
        // Gone mid-flight: whatever we started is over.
        return Stage::None;
    }
    let address = state.target_node_address.as_deref().unwrap_or_default();
    let ports = state
        .target_direct_migration_node_ports
        .as_ref()
        .filter(|p| !p.is_empty());
    let (address, ports) = match (address.is_empty(), ports) {
        (false, Some(ports)) => (address, ports),
        _ => return Stage::Pending { id },
    };
    let target = match parse_ip(address) {
        Some(ip) => ip,
        None => {
            return Stage::Malformed {
                id,
                why: format!("targetNodeAddress {address:?} is not an IP address"),
            };
        }
    };
    let mut parsed = Vec::with_capacity(ports.len());
    for key in ports.keys() {
        match key.trim().parse::<u16>() {
            Ok(port) if port != 0 => parsed.push(port),
            _ => {
                return Stage::Malformed {
                    id,
                    why: format!("targetDirectMigrationNodePorts key {key:?} is not a port"),
                };
            }
        }
    }
    parsed.sort_unstable();
    parsed.dedup();
    Stage::Ready {
        migration: Migration {
            uid: view.uid.clone(),
            id,
            vmi: view.key(),
            role,
            target,
            ports: parsed,
            started: state.start_timestamp.clone(),
        },
    }
}

/// An IP address, also in brackets (`[fd00::1]`).
fn parse_ip(s: &str) -> Option<IpAddr> {
    let s = s.trim();
    let s = s
        .strip_prefix('[')
        .and_then(|s| s.strip_suffix(']'))
        .unwrap_or(s);
    s.parse().ok()
}

/// The events that bring the gateway from `old` (the previous view of this VMI, `None` if
/// unseen) to `new`, for the gateway on `node`. Pure apart from a warning when `new` carries a
/// malformed target address or port (once per migration, not per re-sync).
pub fn events_for(node: &str, old: Option<&VmiView>, new: &VmiView) -> Vec<MigrationEvent> {
    let before = old.map_or(Stage::None, |old| stage(node, old));
    let after = stage(node, new);
    let uid = || new.uid.clone();

    if let Stage::Malformed { id, why } = &after
        && before != after
    {
        warn!(vmi = %new.key(), uid = %new.uid, migration = %id, %why,
            "migration target cannot be read; this migration stays on TCP");
    }

    let was_active = matches!(before, Stage::Ready { .. });
    let same = before.id().is_some() && before.id() == after.id();
    // Every end names the migration it ends: the core then leaves a newer migration of the
    // same VMI alone (one a node hook started before this watch saw it).
    let ended = |aborted: bool, id: Option<&str>| MigrationEvent::Ended {
        uid: uid(),
        aborted,
        migration: id.map(str::to_owned),
    };
    let mut events = Vec::new();
    match &after {
        Stage::Ready { migration } => {
            if was_active && same {
                return events;
            }
            if was_active {
                events.push(ended(true, before.id()));
            }
            events.push(MigrationEvent::Started(migration.clone()));
        }
        Stage::Over { aborted, .. } if was_active => {
            // A different migration that is already over replaced ours: ours did not finish.
            events.push(ended(*aborted || !same, before.id()));
        }
        Stage::Over { id, aborted } if before != after => {
            // Over before this watch saw it in progress (started by a node hook while the
            // watch was away, or long ago): a no-op unless the core carries exactly this one.
            events.push(ended(*aborted, Some(id)));
        }
        Stage::Pending { .. } | Stage::Malformed { .. } if was_active && same => {}
        _ if was_active => events.push(ended(true, before.id())),
        _ => {}
    }
    events
}

// === runner ===

/// Streams the [`MigrationEvent`]s of `node` into `events` (fire and forget: nobody waits for
/// the core here) until `shutdown` is cancelled or the receiver is dropped. API errors are
/// retried with kube's default backoff (800 ms doubling to 30 s, jittered). With `peers`,
/// every migration leaving this node teaches the directory which node serves its target
/// address (before its `Started` is sent), so the lookup does not depend on the peer's
/// annotations being current.
pub async fn watch_migrations(
    client: Client,
    node: String,
    events: mpsc::Sender<EventDelivery>,
    peers: Option<NodePeerDirectory>,
    shutdown: CancellationToken,
) {
    let api: Api<VirtualMachineInstance> = Api::all(client);
    let config = watcher::Config::default().labels(&format!("{MIGRATION}={MIGRATION_RDMA}"));
    let mut vmis = Watch::new(api, config, shutdown.clone());
    let mut state = Tracker::new(node);
    info!(node = %state.node, "watching opted-in VMIs for migrations");
    while let Some(event) = vmis.next().await {
        for (event, target_node) in state.apply(event) {
            if let (Some(peers), MigrationEvent::Started(m)) = (&peers, &event) {
                peers.learn_migration(m, target_node.as_deref());
            }
            debug!(?event, "migration event");
            tokio::select! {
                biased;
                () = shutdown.cancelled() => return,
                sent = events.send(event.into()) => if sent.is_err() {
                    debug!("migration event receiver gone; stopping the VMI watch");
                    return;
                },
            }
        }
    }
}

/// The last view of every opted-in VMI, turning watch events into migration events.
struct Tracker {
    node: String,
    views: HashMap<String, VmiView>,
    /// Uids listed since the last `Init` (a relist), while one is in progress.
    relisted: Option<HashSet<String>>,
}

impl Tracker {
    fn new(node: String) -> Self {
        Self {
            node,
            views: HashMap::new(),
            relisted: None,
        }
    }

    /// Each event with the target node name of its migration (to teach the peer directory).
    fn apply(
        &mut self,
        event: Event<VirtualMachineInstance>,
    ) -> Vec<(MigrationEvent, Option<String>)> {
        match event {
            Event::Init => {
                self.relisted = Some(HashSet::new());
                Vec::new()
            }
            Event::InitApply(vmi) => {
                let view = VmiView::of(&vmi);
                if let Some(seen) = &mut self.relisted {
                    seen.insert(view.uid.clone());
                }
                self.update(view)
            }
            Event::Apply(vmi) => self.update(VmiView::of(&vmi)),
            Event::Delete(vmi) => self.update(VmiView::of(&vmi).into_deleted()),
            Event::InitDone => {
                let seen = self.relisted.take().unwrap_or_default();
                let gone: Vec<String> = self
                    .views
                    .keys()
                    .filter(|uid| !seen.contains(*uid))
                    .cloned()
                    .collect();
                gone.into_iter()
                    .flat_map(|uid| {
                        let last = self.views[&uid].clone();
                        self.update(last.into_deleted())
                    })
                    .collect()
            }
        }
    }

    fn update(&mut self, view: VmiView) -> Vec<(MigrationEvent, Option<String>)> {
        if view.uid.is_empty() {
            return Vec::new();
        }
        let events = events_for(&self.node, self.views.get(&view.uid), &view);
        let target_node = view.migration.as_ref().and_then(|m| m.target_node.clone());
        if view.deleted {
            self.views.remove(&view.uid);
        } else {
            self.views.insert(view.uid.clone(), view);
        }
        events
            .into_iter()
            .map(|e| (e, target_node.clone()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use std::{net::Ipv6Addr, time::Duration};

    use http::Method;
    use serde_json::json;
    use tokio::task::JoinHandle;

    use super::*;
    use rdma_streams_testkit::mock_api::{
        self, ApiServerVerifier, Responder, mock_client, query, respond, send_bytes,
        status_failure, timeout_after, watch_events,
    };

    const NODE: &str = "node-a";
    const OTHER: &str = "node-b";
    const VMIS: &str = "/apis/kubevirt.io/v1/virtualmachineinstances";

    // --- fixtures ---

    fn view(migration: Option<VmiMigrationState>) -> VmiView {
        VmiView {
            uid: "vmi-1".into(),
            namespace: "ns".into(),
            name: "vm".into(),
            opted_in: true,
            deleted: false,
            migration,
        }
    }

    /// A migration from `source` to `target`, published with `address` and `ports`.
    fn state(
        id: &str,
        source: &str,
        target: &str,
        address: Option<&str>,
        ports: &[&str],
    ) -> VmiMigrationState {
        VmiMigrationState {
            migration_uid: Some(id.into()),
            source_node: Some(source.into()),
            target_node: Some(target.into()),
            target_node_address: address.map(Into::into),
            target_direct_migration_node_ports: (!ports.is_empty()).then(|| {
                ports
                    .iter()
                    .enumerate()
                    .map(|(i, p)| ((*p).to_owned(), json!(if i == 0 { 49152 } else { 0 })))
                    .collect()
            }),
            start_timestamp: Some("2026-11-30T05:00:00Z".into()),
            ..Default::default()
        }
    }

    fn outgoing(id: &str) -> VmiMigrationState {
        state(id, NODE, OTHER, Some("10.244.2.7"), &["41000", "40000"])
    }

    fn completed(mut s: VmiMigrationState) -> VmiMigrationState {
        s.completed = Some(true);
        s.end_timestamp = Some("2026-11-30T05:01:00Z".into());
        s
    }

    fn failed(mut s: VmiMigrationState) -> VmiMigrationState {
        s.failed = Some(true);
        s
    }

    fn abort(mut s: VmiMigrationState, status: &str) -> VmiMigrationState {
        s.abort_status = Some(status.into());
        s
    }

    fn started(id: &str, role: Role, target: &str, ports: &[u16]) -> MigrationEvent {
        MigrationEvent::Started(Migration {
            uid: "vmi-1".into(),
            id: id.into(),
            vmi: "ns/vm".into(),
            role,
            target: target.parse().unwrap(),
            ports: ports.to_vec(),
            started: Some("2026-11-30T05:00:00Z".into()),
        })
    }

    fn ended(aborted: bool, id: &str) -> MigrationEvent {
        MigrationEvent::Ended {
            uid: "vmi-1".into(),
            aborted,
            migration: Some(id.into()),
        }
    }

    // --- events_for, as a table ---

    #[test]
    fn events_for_table() {
        let not_opted = VmiView {
            opted_in: false,
            ..view(Some(outgoing("m1")))
        };
        let ipv6 = state(
            "m1",
            OTHER,
            NODE,
            Some("fd00:10:244::7"),
            &["45000", "45001"],
        );
        let ipv6_bracketed = state("m1", NODE, OTHER, Some("[fd00::7]"), &["45000"]);
        let pending = state("m1", NODE, OTHER, None, &[]);
        let address_only = state("m1", NODE, OTHER, Some("10.244.2.7"), &[]);
        let bad_address = state("m1", NODE, OTHER, Some("node-b.example"), &["40000"]);
        let bad_port = state("m1", NODE, OTHER, Some("10.244.2.7"), &["40000", "70000"]);
        let elsewhere = state("m1", OTHER, "node-c", Some("10.244.3.7"), &["40000"]);

        #[rustfmt::skip]
        let cases: Vec<(&str, Option<VmiView>, VmiView, Vec<MigrationEvent>)> = vec![
            ("no migration", None, view(None), vec![]),
            ("from this node", None, view(Some(outgoing("m1"))),
                vec![started("m1", Role::Source, "10.244.2.7", &[40000, 41000])]),
            ("to this node, IPv6", None, view(Some(ipv6.clone())),
                vec![started("m1", Role::Target, "fd00:10:244::7", &[45000, 45001])]),
            ("IPv6 in brackets", None, view(Some(ipv6_bracketed)),
                vec![started("m1", Role::Source, "fd00::7", &[45000])]),
            ("between two other nodes", None, view(Some(elsewhere)), vec![]),
            ("not opted in", None, not_opted.clone(), vec![]),
            ("target not published yet", None, view(Some(pending.clone())), vec![]),
            ("address without ports", Some(view(Some(pending.clone()))), view(Some(address_only.clone())), vec![]),
            ("published later", Some(view(Some(address_only))), view(Some(outgoing("m1"))),
                vec![started("m1", Role::Source, "10.244.2.7", &[40000, 41000])]),
            ("malformed address", Some(view(Some(pending.clone()))), view(Some(bad_address.clone())), vec![]),
            ("malformed port", None, view(Some(bad_port)), vec![]),
            ("malformed then fixed", Some(view(Some(bad_address))), view(Some(outgoing("m1"))),
                vec![started("m1", Role::Source, "10.244.2.7", &[40000, 41000])]),
            ("re-sync of the same state", Some(view(Some(outgoing("m1")))), view(Some(outgoing("m1"))), vec![]),
            ("re-sync with a target", Some(view(Some(ipv6.clone()))), view(Some(ipv6)), vec![]),
            ("completed", Some(view(Some(outgoing("m1")))), view(Some(completed(outgoing("m1")))),
                vec![ended(false, "m1")]),
            ("completed, re-sync", Some(view(Some(completed(outgoing("m1"))))),
                view(Some(completed(outgoing("m1")))), vec![]),
            // Over before this watch saw it run (a node hook may have started it): the end is
            // named, so the core ends only that migration.
            ("completed, first seen", None, view(Some(completed(outgoing("m1")))), vec![ended(false, "m1")]),
            ("failed", Some(view(Some(outgoing("m1")))), view(Some(failed(outgoing("m1")))),
                vec![ended(true, "m1")]),
            ("abort succeeded", Some(view(Some(outgoing("m1")))),
                view(Some(abort(outgoing("m1"), "Succeeded"))), vec![ended(true, "m1")]),
            ("aborting: not over yet", Some(view(Some(outgoing("m1")))),
                view(Some(abort(outgoing("m1"), "Aborting"))), vec![]),
            ("abort failed: goes on", Some(view(Some(outgoing("m1")))),
                view(Some(abort(outgoing("m1"), "Failed"))), vec![]),
            ("never started, then failed", Some(view(Some(pending.clone()))),
                view(Some(failed(pending.clone()))), vec![ended(true, "m1")]),
            ("deleted mid-flight", Some(view(Some(outgoing("m1")))),
                view(Some(outgoing("m1"))).into_deleted(), vec![ended(true, "m1")]),
            ("deleted after completion", Some(view(Some(outgoing("m1")))),
                view(Some(completed(outgoing("m1")))).into_deleted(), vec![ended(false, "m1")]),
            ("deleted, never started", Some(view(Some(pending.clone()))),
                view(Some(pending)).into_deleted(), vec![]),
            ("opted out mid-flight", Some(view(Some(outgoing("m1")))), not_opted, vec![ended(true, "m1")]),
            ("new migration replaces the old", Some(view(Some(outgoing("m1")))), view(Some(outgoing("m2"))),
                vec![ended(true, "m1"), started("m2", Role::Source, "10.244.2.7", &[40000, 41000])]),
            ("new migration, not published yet", Some(view(Some(outgoing("m1")))),
                view(Some(state("m2", NODE, OTHER, None, &[]))), vec![ended(true, "m1")]),
            ("new migration already over", Some(view(Some(outgoing("m1")))),
                view(Some(completed(outgoing("m2")))), vec![ended(true, "m1")]),
            ("VMI moved here, migrating on", Some(view(Some(completed(state("m1", OTHER, NODE, Some("10.244.1.9"), &["40000"]))))),
                view(Some(state("m2", NODE, "node-c", Some("10.244.3.9"), &["42000"]))),
                vec![started("m2", Role::Source, "10.244.3.9", &[42000])]),
        ];
        for (name, old, new, want) in cases {
            assert_eq!(events_for(NODE, old.as_ref(), &new), want, "case: {name}");
        }
    }

    /// Runs `f` with a subscriber that captures WARN lines; returns them.
    fn warnings_of(f: impl FnOnce()) -> Vec<String> {
        use std::sync::{Arc, Mutex};
        #[derive(Clone, Default)]
        struct Buf(Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Buf {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let buf = Buf::default();
        let writer = buf.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::WARN)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, f);
        let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        text.lines().map(str::to_owned).collect()
    }

    #[test]
    fn malformed_targets_warn_once_per_migration() {
        let bad = view(Some(state("m1", NODE, OTHER, Some("10.244.2"), &["40000"])));
        let warnings = warnings_of(|| {
            assert_eq!(events_for(NODE, None, &bad), vec![]);
            assert_eq!(events_for(NODE, Some(&bad), &bad), vec![], "re-sync");
        });
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(warnings[0].contains("targetNodeAddress"), "{warnings:?}");
        assert!(warnings[0].contains("ns/vm"), "{warnings:?}");
        let bad_port = view(Some(state("m1", NODE, OTHER, Some("10.244.2.7"), &["0"])));
        let warnings = warnings_of(|| {
            assert_eq!(events_for(NODE, Some(&bad), &bad_port), vec![]);
        });
        assert_eq!(warnings.len(), 1, "new reason, new warning: {warnings:?}");
        assert!(warnings[0].contains("\"0\" is not a port"), "{warnings:?}");
    }

    #[test]
    fn vmi_json_with_unknown_and_odd_fields_parses() {
        let vmi: VirtualMachineInstance = serde_json::from_value(json!({
            "apiVersion": "kubevirt.io/v1",
            "kind": "VirtualMachineInstance",
            "metadata": { "name": "vm", "namespace": "ns", "uid": "u" },
            "spec": { "domain": { "devices": {} } },
            "status": {
                "phase": "Running",
                "migrationState": { "targetNodeAddress": 42, "completed": "yes" },
            },
        }))
        .unwrap();
        assert_eq!(
            vmi.status.migration_state, None,
            "odd migrationState ignored"
        );
        let vmi: VirtualMachineInstance = serde_json::from_value(json!({
            "metadata": { "uid": "u" },
            "status": { "migrationState": { "futureField": 1, "completed": null } },
        }))
        .unwrap();
        assert_eq!(
            vmi.status.migration_state,
            Some(VmiMigrationState::default())
        );
        let vmi: VirtualMachineInstance = serde_json::from_value(json!({})).unwrap();
        assert!(vmi.status.migration_state.is_none());
    }

    #[test]
    fn bracketless_and_bracketed_ipv6() {
        assert_eq!(parse_ip("[::1]"), Some(IpAddr::V6(Ipv6Addr::LOCALHOST)));
        assert_eq!(parse_ip(" ::1 "), Some(IpAddr::V6(Ipv6Addr::LOCALHOST)));
        assert_eq!(parse_ip("10.0.0.1:80"), None);
    }

    // --- the runner against a mocked API server ---

    fn vmi_json(uid: &str, rv: &str, migration: Option<&VmiMigrationState>) -> Value {
        json!({
            "apiVersion": "kubevirt.io/v1",
            "kind": "VirtualMachineInstance",
            "metadata": {
                "name": format!("vm-{uid}"),
                "namespace": "ns",
                "uid": uid,
                "resourceVersion": rv,
                "labels": { MIGRATION: MIGRATION_RDMA, "kubevirt.io/nodeName": NODE },
            },
            "spec": { "domain": { "cpu": { "cores": 2 } } },
            "status": { "phase": "Running", "nodeName": NODE, "migrationState": migration },
        })
    }

    fn list(rv: &str, items: Vec<Value>) -> Value {
        mock_api::list("kubevirt.io/v1", "VirtualMachineInstanceList", rv, items)
    }

    fn gone_410() -> Value {
        json!({ "type": "ERROR", "object": status_failure(410, "Expired", "too old resource version: 1 (200)") })
    }

    /// The API calls a test expects, in order.
    enum Scenario {
        /// LIST with vmi `a` mid-migration; WATCH delivers `b` added (target pending),
        /// modified (published), `a` completed, `b` deleted; re-WATCH held.
        MigrationLifecycle,
        /// LIST answered 500; LIST again with `a` and `b` migrating; WATCH answers 410 Gone;
        /// relist has only `b`; WATCH held.
        ErrorsAndRelist,
    }

    async fn expect_list(api: &mut ApiServerVerifier) -> Responder {
        let (request, send) = api.expect(Method::GET, VMIS).await;
        let q = query(&request);
        assert!(!q.contains("watch=true"), "a LIST: {q}");
        assert!(
            q.contains("labelSelector=rdma-streams.io%2Fmigration%3Drdma"),
            "opt-in selector: {q}"
        );
        send
    }

    async fn expect_watch(api: &mut ApiServerVerifier, rv: &str) -> Responder {
        let (request, send) = api.expect(Method::GET, VMIS).await;
        let q = query(&request);
        assert!(q.contains("watch=true"), "{q}");
        assert!(q.contains(&format!("resourceVersion={rv}")), "{q}");
        assert!(
            q.contains("labelSelector=rdma-streams.io%2Fmigration%3Drdma"),
            "{q}"
        );
        send
    }

    fn run(
        mut api: ApiServerVerifier,
        scenario: Scenario,
        held: tokio::sync::oneshot::Sender<Responder>,
    ) -> JoinHandle<()> {
        tokio::spawn(async move {
            let a_out = outgoing("ma");
            let b_in_pending = state("mb", OTHER, NODE, None, &[]);
            let b_in = state("mb", OTHER, NODE, Some("fd00::b"), &["46000"]);
            match scenario {
                Scenario::MigrationLifecycle => {
                    let send = expect_list(&mut api).await;
                    respond(
                        send,
                        200,
                        &list("100", vec![vmi_json("a", "90", Some(&a_out))]),
                    );
                    let send = expect_watch(&mut api, "100").await;
                    let body = watch_events(&[
                        ("ADDED", vmi_json("b", "101", Some(&b_in_pending))),
                        ("MODIFIED", vmi_json("b", "102", Some(&b_in))),
                        ("MODIFIED", vmi_json("b", "103", Some(&b_in))),
                        ("MODIFIED", vmi_json("a", "104", Some(&completed(a_out)))),
                        ("DELETED", vmi_json("b", "105", Some(&b_in))),
                    ]);
                    send_bytes(send, 200, body);
                    let _ = held.send(expect_watch(&mut api, "105").await);
                }
                Scenario::ErrorsAndRelist => {
                    let send = expect_list(&mut api).await;
                    respond(
                        send,
                        500,
                        &status_failure(500, "InternalError", "etcd down"),
                    );
                    let send = expect_list(&mut api).await;
                    respond(
                        send,
                        200,
                        &list(
                            "200",
                            vec![
                                vmi_json("a", "190", Some(&a_out)),
                                vmi_json("b", "191", Some(&b_in)),
                            ],
                        ),
                    );
                    let send = expect_watch(&mut api, "200").await;
                    send_bytes(send, 200, format!("{}\n", gone_410()).into_bytes());
                    let send = expect_list(&mut api).await;
                    respond(
                        send,
                        200,
                        &list("300", vec![vmi_json("b", "191", Some(&b_in))]),
                    );
                    let _ = held.send(expect_watch(&mut api, "300").await);
                }
            }
        })
    }

    async fn next_events(rx: &mut mpsc::Receiver<EventDelivery>, n: usize) -> Vec<MigrationEvent> {
        let mut out = Vec::new();
        for _ in 0..n {
            let delivery = tokio::time::timeout(Duration::from_secs(60), rx.recv())
                .await
                .expect("event in time")
                .expect("runner alive");
            assert!(delivery.handled.is_none(), "the watch waits for nobody");
            out.push(delivery.event);
        }
        out
    }

    /// VMI `uid`'s migration (whose id is `m<uid>` in the scenarios).
    fn mig(uid: &str, role: Role, target: &str, ports: &[u16]) -> MigrationEvent {
        MigrationEvent::Started(Migration {
            uid: uid.into(),
            id: format!("m{uid}"),
            vmi: format!("ns/vm-{uid}"),
            role,
            target: target.parse().unwrap(),
            ports: ports.to_vec(),
            started: Some("2026-11-30T05:00:00Z".into()),
        })
    }

    fn end(uid: &str, aborted: bool) -> MigrationEvent {
        MigrationEvent::Ended {
            uid: uid.into(),
            aborted,
            migration: Some(format!("m{uid}")),
        }
    }

    #[tokio::test]
    async fn watch_events_become_migration_events() {
        let (client, verifier) = mock_client();
        let (held_tx, held_rx) = tokio::sync::oneshot::channel();
        let scenario = run(verifier, Scenario::MigrationLifecycle, held_tx);
        let (tx, mut rx) = mpsc::channel(16);
        let shutdown = CancellationToken::new();
        let peers = NodePeerDirectory::detached();
        let runner = tokio::spawn(watch_migrations(
            client,
            NODE.into(),
            tx,
            Some(peers.clone()),
            shutdown.clone(),
        ));

        let events = next_events(&mut rx, 4).await;
        assert_eq!(
            events,
            vec![
                mig("a", Role::Source, "10.244.2.7", &[40000, 41000]),
                mig("b", Role::Target, "fd00::b", &[46000]),
                end("a", false),
                end("b", true),
            ]
        );
        assert_eq!(
            peers.learned_node("10.244.2.7".parse().unwrap()).as_deref(),
            Some(OTHER),
            "outgoing target taught to the peer directory"
        );
        let _watch = held_rx.await.unwrap();
        timeout_after(Duration::from_secs(1), scenario).await;
        assert!(rx.try_recv().is_err(), "no duplicate events");

        shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(1), runner)
            .await
            .expect("runner stops on shutdown")
            .unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn api_errors_are_retried_and_a_relist_ends_vanished_vmis() {
        let (client, verifier) = mock_client();
        let (held_tx, held_rx) = tokio::sync::oneshot::channel();
        let scenario = run(verifier, Scenario::ErrorsAndRelist, held_tx);
        let (tx, mut rx) = mpsc::channel(16);
        let shutdown = CancellationToken::new();
        let runner = tokio::spawn(watch_migrations(
            client,
            NODE.into(),
            tx,
            None,
            shutdown.clone(),
        ));

        // Paused clock: the backoffs after the 500 and the 410 elapse instantly.
        let events = next_events(&mut rx, 3).await;
        assert_eq!(
            events,
            vec![
                mig("a", Role::Source, "10.244.2.7", &[40000, 41000]),
                mig("b", Role::Target, "fd00::b", &[46000]),
                end("a", true),
            ],
            "b survives the relist without a second Started; a vanished"
        );
        let _watch = tokio::time::timeout(Duration::from_secs(60), held_rx)
            .await
            .expect("re-watch after the relist")
            .unwrap();
        timeout_after(Duration::from_secs(60), scenario).await;
        assert!(rx.try_recv().is_err());

        shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(1), runner)
            .await
            .unwrap()
            .unwrap();
    }

    #[tokio::test]
    async fn dropped_receiver_stops_the_runner() {
        let (client, mut verifier) = mock_client();
        let (tx, rx) = mpsc::channel(1);
        drop(rx);
        let shutdown = CancellationToken::new();
        let runner = tokio::spawn(watch_migrations(client, NODE.into(), tx, None, shutdown));
        let scenario = tokio::spawn(async move {
            let send = expect_list(&mut verifier).await;
            respond(
                send,
                200,
                &list("1", vec![vmi_json("a", "1", Some(&outgoing("ma")))]),
            );
            // The runner may or may not start the WATCH before it notices; either is fine.
            drop(verifier);
        });
        timeout_after(Duration::from_secs(1), scenario).await;
        tokio::time::timeout(Duration::from_secs(1), runner)
            .await
            .expect("runner stops when nobody listens")
            .unwrap();
    }
}
