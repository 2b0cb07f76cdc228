//! Finding the peer gateway of a migration target, through annotations on Nodes.
//!
//! **The problem.** A source gateway knows the target virt-handler's migration address
//! (`status.migrationState.targetNodeAddress`): the target virt-handler *pod's* IP, or the IP
//! of its `migration0` Multus interface when KubeVirt has a dedicated migration network. Neither
//! is a node address, and the gateway it needs (a hostNetwork pod) listens on the target
//! *node's* address. So the source needs "virt-handler address -> node -> gateway address".
//!
//! **What each gateway publishes** on its own Node object ([`NodePublisher`], a JSON merge
//! patch, retried with backoff, removed on shutdown):
//!
//! | annotation | value | example |
//! | --- | --- | --- |
//! | [`GATEWAY_ADDRESS_ANNOTATION`] `rdma-streams.io/gateway-address` | where peers reach this gateway, `ip:port` (`[v6]:port`) | `10.0.0.12:7471` |
//! | [`VIRT_HANDLER_ADDRESSES_ANNOTATION`] `rdma-streams.io/virt-handler-addresses` | the local virt-handler's addresses, comma-separated | `10.244.1.5,fd00:10:244:1::5,192.168.50.12` |
//!
//! The virt-handler addresses are what [`super::virt_handler::watch_addresses`] finds in the
//! virt-handler network namespace the gateway enters anyway to program nftables: every global
//! unicast address of every interface there, which covers the pod IP(s) and `migration0`,
//! needs no Pod watch (and no `pods` RBAC), and follows a virt-handler restart (new pod, new
//! IP) through [`run_node_publisher`]'s `watch` channel.
//!
//! **How [`NodePeerDirectory::peer_for`] answers**, first match wins:
//! 1. *Learned*: the VMI watch ([`super::vmi::watch_migrations`]) sees `targetNodeAddress` and
//!    `targetNode` in the same object and records `address -> node name` before it emits
//!    `Started`; the answer is that node's gateway annotation. This is race-free: it does not
//!    wait for the target gateway to republish anything.
//! 2. A Node whose `virt-handler-addresses` annotation lists the address.
//! 3. A Node whose `status.addresses` contain it (a virt-handler on the host network).
//!
//! A node without a (parseable) gateway annotation has no gateway: `None`, and the data path
//! leaves the migration on TCP.
//!
//! The Node cache keeps only each Node's name, our two annotations and `status.addresses`.
//! Node objects cannot be selected by annotation, so every Node is watched (one small entry
//! each).

use std::{
    collections::{BTreeMap, HashMap},
    net::{IpAddr, SocketAddr},
    sync::{Arc, RwLock},
    time::Duration,
};

use k8s_openapi::api::core::v1::{Node, NodeStatus};
use kube::{
    Api, Client,
    api::{Patch, PatchParams},
    runtime::{
        reflector::ObjectRef,
        watcher::{self, DefaultBackoff},
    },
};
use rdma_streams_common::{backoff::Backoff, kube::Cache, report::Report};
use serde_json::{Value, json};
use tokio::{sync::watch, task::JoinHandle};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::FIELD_MANAGER;
use crate::events::{Migration, Role};

/// Node annotation: where peers reach this node's gateway (`ip:port`).
pub const GATEWAY_ADDRESS_ANNOTATION: &str = "rdma-streams.io/gateway-address";
/// Node annotation: the local virt-handler's migration addresses (comma-separated IPs).
pub const VIRT_HANDLER_ADDRESSES_ANNOTATION: &str = "rdma-streams.io/virt-handler-addresses";

/// How long [`NodePublisher::remove`] keeps trying at shutdown.
pub const REMOVE_DEADLINE: Duration = Duration::from_secs(5);

/// Most learned `address -> node` pairs kept; learning more starts over (each migration
/// teaches its own pair again right before it is needed).
const MAX_LEARNED: usize = 4096;

// === what a gateway publishes ===

/// The annotations one gateway publishes on its Node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeAnnotations {
    /// Where peer gateways connect.
    pub gateway: SocketAddr,
    /// The local virt-handler's migration addresses (may be empty until known).
    pub virt_handler: Vec<IpAddr>,
}

impl NodeAnnotations {
    /// The JSON merge patch that sets both annotations and touches nothing else.
    pub fn patch(&self) -> Value {
        let mut addrs = self.virt_handler.clone();
        addrs.sort();
        addrs.dedup();
        let addrs = addrs
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(",");
        json!({ "metadata": { "annotations": {
            GATEWAY_ADDRESS_ANNOTATION: self.gateway.to_string(),
            VIRT_HANDLER_ADDRESSES_ANNOTATION: addrs,
        }}})
    }

    /// The JSON merge patch that removes both annotations.
    pub fn removal_patch() -> Value {
        json!({ "metadata": { "annotations": {
            GATEWAY_ADDRESS_ANNOTATION: null,
            VIRT_HANDLER_ADDRESSES_ANNOTATION: null,
        }}})
    }
}

/// Writes this gateway's annotations on its own Node.
#[derive(Clone)]
pub struct NodePublisher {
    api: Api<Node>,
    node: String,
}

impl NodePublisher {
    pub fn new(client: Client, node: impl Into<String>) -> Self {
        Self {
            api: Api::all(client),
            node: node.into(),
        }
    }

    async fn patch(&self, body: &Value) -> Result<(), kube::Error> {
        // `Patch::Merge` is sent as `application/merge-patch+json`.
        let params = PatchParams {
            field_manager: Some(FIELD_MANAGER.to_owned()),
            ..PatchParams::default()
        };
        self.api
            .patch(&self.node, &params, &Patch::Merge(body))
            .await
            .map(drop)
    }

    /// Sets `annotations`, retrying with kube's default backoff (800 ms doubling to 30 s) until
    /// it succeeds (`true`) or `shutdown` is cancelled (`false`).
    pub async fn publish(
        &self,
        annotations: &NodeAnnotations,
        shutdown: &CancellationToken,
    ) -> bool {
        let body = annotations.patch();
        let mut backoff = DefaultBackoff::default();
        loop {
            match self.patch(&body).await {
                Ok(()) => {
                    info!(node = %self.node, gateway = %annotations.gateway,
                        virt_handler = ?annotations.virt_handler, "published gateway address");
                    return true;
                }
                Err(error) => {
                    let delay = backoff.next().unwrap_or(Duration::from_secs(30));
                    warn!(node = %self.node, error = %Report(&error), ?delay, "publishing gateway address failed; retrying");
                    tokio::select! {
                        () = shutdown.cancelled() => return false,
                        () = tokio::time::sleep(delay) => {}
                    }
                }
            }
        }
    }

    /// Removes the annotations, retrying for at most `deadline`.
    pub async fn remove(&self, deadline: Duration) -> Result<(), kube::Error> {
        let body = NodeAnnotations::removal_patch();
        let give_up = tokio::time::Instant::now() + deadline;
        let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(2));
        loop {
            match self.patch(&body).await {
                Ok(()) => {
                    info!(node = %self.node, "removed gateway address");
                    return Ok(());
                }
                Err(error) => {
                    let delay = backoff.next_delay();
                    if tokio::time::Instant::now() + delay >= give_up {
                        return Err(error);
                    }
                    warn!(node = %self.node, error = %Report(&error), "removing gateway address failed; retrying");
                    tokio::time::sleep(delay).await;
                }
            }
        }
    }
}

/// Publishes `gateway` and the virt-handler addresses from `virt_handler` on `node` (again each
/// time they change), and removes both annotations once `shutdown` is cancelled (for at most
/// [`REMOVE_DEADLINE`]). Ends after the removal, or when the `virt_handler` sender is dropped
/// (then also removing).
pub async fn run_node_publisher(
    client: Client,
    node: String,
    gateway: SocketAddr,
    mut virt_handler: watch::Receiver<Vec<IpAddr>>,
    shutdown: CancellationToken,
) {
    let publisher = NodePublisher::new(client, node);
    loop {
        let annotations = NodeAnnotations {
            gateway,
            virt_handler: virt_handler.borrow_and_update().clone(),
        };
        // `publish` gives up only on shutdown.
        publisher.publish(&annotations, &shutdown).await;
        tokio::select! {
            () = shutdown.cancelled() => break,
            changed = virt_handler.changed() => if changed.is_err() { break },
        }
    }
    if let Err(error) = publisher.remove(REMOVE_DEADLINE).await {
        warn!(node = %publisher.node, error = %Report(&error), "could not remove the gateway address; peers will fall back to TCP when they cannot reach it");
    }
}

// === peer lookup ===

/// Answers which gateway serves a target virt-handler address, from a cache of Nodes plus
/// what the VMI watch learned. Cheap to clone.
#[derive(Clone)]
pub struct NodePeerDirectory {
    /// `None` for a detached directory.
    nodes: Option<Cache<Node>>,
    learned: Arc<RwLock<HashMap<IpAddr, String>>>,
}

impl NodePeerDirectory {
    /// Starts the Node cache; the task runs until `shutdown` is cancelled. API errors are
    /// retried with kube's default backoff.
    pub fn spawn(client: Client, shutdown: CancellationToken) -> (Self, JoinHandle<()>) {
        let (nodes, watch) = Cache::new(
            Api::all(client),
            watcher::Config::default(),
            slim_node,
            shutdown,
        );
        let directory = Self {
            nodes: Some(nodes),
            learned: Arc::default(),
        };
        (directory, tokio::spawn(watch.run()))
    }

    /// A directory with no Node watch: it only knows nothing (tests).
    #[cfg(test)]
    pub fn detached() -> Self {
        Self {
            nodes: None,
            learned: Arc::default(),
        }
    }

    /// Records that `target` (a virt-handler migration address) lives on `node`.
    pub fn learn(&self, target: IpAddr, node: &str) {
        let mut learned = self.learned.write().unwrap_or_else(|e| e.into_inner());
        if learned.len() >= MAX_LEARNED && !learned.contains_key(&target) {
            learned.clear();
        }
        learned.insert(target, node.to_owned());
    }

    /// Before a source migration starts: its target's migration address lives on
    /// `target_node` (`migrationState.targetNode`), so the first captured connection finds that
    /// node's gateway without waiting for the node's published addresses. Both triggers (the
    /// VMI watch and the node hook) call this; a target migration learns nothing.
    pub fn learn_migration(&self, m: &Migration, target_node: Option<&str>) {
        if let (Role::Source, Some(node)) = (m.role, target_node) {
            self.learn(m.target, node);
        }
    }

    /// The node learned for `target`, if any.
    pub fn learned_node(&self, target: IpAddr) -> Option<String> {
        let learned = self.learned.read().unwrap_or_else(|e| e.into_inner());
        learned.get(&target).cloned()
    }

    /// Which gateway serves the virt-handler at `target_virt_handler`; `None` if no node with a
    /// gateway is known for it (the data path then stays on TCP).
    pub fn peer_for(&self, target_virt_handler: IpAddr) -> Option<SocketAddr> {
        let store = self.nodes.as_ref()?.store();
        if let Some(node) = self.learned_node(target_virt_handler)
            && let Some(found) = store.get(&ObjectRef::new(&node))
        {
            return gateway_of(&found);
        }
        let nodes = store.state();
        peer_in(nodes.iter().map(AsRef::as_ref), target_virt_handler)
    }

    /// Whether the first full list of Nodes has been stored.
    pub fn is_synced(&self) -> bool {
        self.nodes.as_ref().is_none_or(|n| n.synced().is_synced())
    }

    /// Waits until synced; `false` if the directory stopped before.
    #[cfg(test)]
    pub async fn wait_synced(&self) -> bool {
        match &self.nodes {
            None => true,
            Some(nodes) => nodes.synced().wait().await,
        }
    }
}

impl crate::streams::PeerLookup for NodePeerDirectory {
    fn lookup(&self, target: IpAddr) -> Option<SocketAddr> {
        self.peer_for(target)
    }
}

impl std::fmt::Debug for NodePeerDirectory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodePeerDirectory")
            .field("nodes", &self.nodes.as_ref().map(|n| n.store().len()))
            .field("synced", &self.is_synced())
            .finish_non_exhaustive()
    }
}

/// Keeps what lookups need: the name, our annotations and `status.addresses`.
fn slim_node(node: &mut Node) {
    let meta = &mut node.metadata;
    meta.managed_fields = None;
    meta.labels = None;
    meta.owner_references = None;
    if let Some(annotations) = &mut meta.annotations {
        annotations.retain(|k, _| {
            k == GATEWAY_ADDRESS_ANNOTATION || k == VIRT_HANDLER_ADDRESSES_ANNOTATION
        });
    }
    node.spec = None;
    node.status = node.status.take().map(|status| NodeStatus {
        addresses: status.addresses,
        ..NodeStatus::default()
    });
}

fn annotation<'a>(node: &'a Node, key: &str) -> Option<&'a str> {
    node.metadata
        .annotations
        .as_ref()
        .and_then(|a: &'a BTreeMap<String, String>| a.get(key))
        .map(String::as_str)
}

/// The gateway address a node publishes, if any and parseable.
pub fn gateway_of(node: &Node) -> Option<SocketAddr> {
    let raw = annotation(node, GATEWAY_ADDRESS_ANNOTATION)?;
    match raw.trim().parse() {
        Ok(addr) => Some(addr),
        Err(_) => {
            debug!(node = ?node.metadata.name, value = raw, "unparseable gateway address annotation");
            None
        }
    }
}

/// The virt-handler addresses a node publishes (unparseable entries skipped).
pub fn virt_handler_addresses_of(node: &Node) -> Vec<IpAddr> {
    annotation(node, VIRT_HANDLER_ADDRESSES_ANNOTATION)
        .map(|raw| {
            raw.split(',')
                .filter_map(|s| s.trim().parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

fn has_node_address(node: &Node, ip: IpAddr) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.addresses.as_ref())
        .is_some_and(|addrs| {
            addrs
                .iter()
                .any(|a| a.address.trim().parse::<IpAddr>().ok() == Some(ip))
        })
}

/// Lookup steps 2 and 3 of the module doc over `nodes`.
pub fn peer_in<'a>(
    nodes: impl Iterator<Item = &'a Node> + Clone,
    ip: IpAddr,
) -> Option<SocketAddr> {
    nodes
        .clone()
        .find(|n| virt_handler_addresses_of(n).contains(&ip))
        .or_else(|| nodes.clone().find(|n| has_node_address(n, ip)))
        .and_then(gateway_of)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use http::Method;
    use serde_json::json;

    use super::*;
    use rdma_streams_testkit::mock_api::{
        ApiServerVerifier, Responder, body_json, mock_client, query, respond, status_failure,
        timeout_after,
    };

    const NODES: &str = "/api/v1/nodes";

    fn node_json(name: &str, annotations: Value, addresses: &[&str]) -> Value {
        json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "resourceVersion": "1",
                "labels": { "kubernetes.io/hostname": name },
                "annotations": annotations,
            },
            "spec": { "podCIDR": "10.244.0.0/24" },
            "status": {
                "addresses": addresses.iter().map(|a| json!({ "type": "InternalIP", "address": a })).collect::<Vec<_>>(),
                "capacity": { "cpu": "2" },
            },
        })
    }

    fn node_list(items: Vec<Value>) -> Value {
        json!({ "apiVersion": "v1", "kind": "NodeList", "metadata": { "resourceVersion": "10" }, "items": items })
    }

    fn nodes_fixture() -> Vec<Value> {
        vec![
            node_json(
                "node-a",
                json!({
                    GATEWAY_ADDRESS_ANNOTATION: "10.0.0.1:7471",
                    VIRT_HANDLER_ADDRESSES_ANNOTATION: "10.244.1.5, fd00:10:244:1::5,192.168.50.1",
                    "other.io/big": "x".repeat(64),
                }),
                &["10.0.0.1"],
            ),
            node_json(
                "node-b",
                json!({ GATEWAY_ADDRESS_ANNOTATION: "[fd00::2]:7471", VIRT_HANDLER_ADDRESSES_ANNOTATION: "" }),
                &["10.0.0.2", "fd00::2"],
            ),
            node_json(
                "node-c",
                json!({ VIRT_HANDLER_ADDRESSES_ANNOTATION: "10.244.3.5" }),
                &["10.0.0.3"],
            ),
            node_json(
                "node-d",
                json!({ GATEWAY_ADDRESS_ANNOTATION: "not-an-address", VIRT_HANDLER_ADDRESSES_ANNOTATION: "10.244.4.5" }),
                &["10.0.0.4"],
            ),
        ]
    }

    fn sock(s: &str) -> Option<SocketAddr> {
        Some(s.parse().unwrap())
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn patches_set_and_remove_exactly_our_annotations() {
        let annotations = NodeAnnotations {
            gateway: "[fd00::1]:7471".parse().unwrap(),
            virt_handler: vec![ip("10.244.1.5"), ip("fd00::5"), ip("10.244.1.5")],
        };
        assert_eq!(
            annotations.patch(),
            json!({ "metadata": { "annotations": {
                "rdma-streams.io/gateway-address": "[fd00::1]:7471",
                "rdma-streams.io/virt-handler-addresses": "10.244.1.5,fd00::5",
            }}})
        );
        assert_eq!(
            NodeAnnotations::removal_patch(),
            json!({ "metadata": { "annotations": {
                "rdma-streams.io/gateway-address": null,
                "rdma-streams.io/virt-handler-addresses": null,
            }}})
        );
    }

    #[test]
    fn lookup_from_a_node_list() {
        let nodes: Vec<Node> = nodes_fixture()
            .into_iter()
            .map(|v| serde_json::from_value(v).unwrap())
            .collect();
        let cases = [
            ("virt-handler pod IP", "10.244.1.5", sock("10.0.0.1:7471")),
            (
                "virt-handler IPv6",
                "fd00:10:244:1::5",
                sock("10.0.0.1:7471"),
            ),
            ("migration0 address", "192.168.50.1", sock("10.0.0.1:7471")),
            (
                "node address, IPv6 gateway",
                "fd00::2",
                sock("[fd00::2]:7471"),
            ),
            ("node without a gateway", "10.244.3.5", None),
            ("unparseable gateway annotation", "10.244.4.5", None),
            ("unknown address", "10.244.9.9", None),
        ];
        for (name, target, want) in cases {
            assert_eq!(peer_in(nodes.iter(), ip(target)), want, "case: {name}");
        }
    }

    async fn expect_patch(api: &mut ApiServerVerifier, node: &str) -> (Value, Responder) {
        let (request, send) = api.expect(Method::PATCH, &format!("{NODES}/{node}")).await;
        assert_eq!(
            request.headers()["content-type"],
            "application/merge-patch+json"
        );
        assert!(
            query(&request).contains("fieldManager=rdma-migration-gateway"),
            "{}",
            query(&request)
        );
        (body_json(request).await, send)
    }

    fn ok_node(send: Responder, name: &str) {
        respond(send, 200, &node_json(name, json!({}), &[]));
    }

    #[tokio::test(start_paused = true)]
    async fn publisher_patches_retries_republishes_and_removes_on_shutdown() {
        let (client, mut api) = mock_client();
        let gateway: SocketAddr = "10.0.0.1:7471".parse().unwrap();
        let (vh_tx, vh_rx) = watch::channel(vec![ip("10.244.1.5")]);
        let shutdown = CancellationToken::new();
        let publisher = tokio::spawn(run_node_publisher(
            client,
            "node-a".into(),
            gateway,
            vh_rx,
            shutdown.clone(),
        ));

        let (body, send) = expect_patch(&mut api, "node-a").await;
        let first = json!({ "metadata": { "annotations": {
            GATEWAY_ADDRESS_ANNOTATION: "10.0.0.1:7471",
            VIRT_HANDLER_ADDRESSES_ANNOTATION: "10.244.1.5",
        }}});
        assert_eq!(body, first);
        respond(
            send,
            500,
            &status_failure(500, "InternalError", "etcd down"),
        );
        // Retried after a backoff (paused clock: instant), with the same body.
        let (body, send) = expect_patch(&mut api, "node-a").await;
        assert_eq!(body, first);
        ok_node(send, "node-a");

        // virt-handler restarted with a new IP, plus a migration network.
        vh_tx.send_replace(vec![ip("192.168.50.1"), ip("10.244.1.77")]);
        let (body, send) = expect_patch(&mut api, "node-a").await;
        assert_eq!(
            body["metadata"]["annotations"][VIRT_HANDLER_ADDRESSES_ANNOTATION],
            "10.244.1.77,192.168.50.1"
        );
        ok_node(send, "node-a");

        shutdown.cancel();
        let (body, send) = expect_patch(&mut api, "node-a").await;
        assert_eq!(body, NodeAnnotations::removal_patch());
        ok_node(send, "node-a");
        tokio::time::timeout(Duration::from_secs(1), publisher)
            .await
            .expect("publisher ends after removal")
            .unwrap();
        api.expect_quiet(Duration::from_millis(50)).await;
    }

    #[tokio::test(start_paused = true)]
    async fn removal_gives_up_after_its_deadline() {
        let (client, mut api) = mock_client();
        let publisher = NodePublisher::new(client, "node-a");
        let remove = tokio::spawn(async move { publisher.remove(Duration::from_secs(1)).await });
        let scenario = tokio::spawn(async move {
            loop {
                let Ok(Some((_, send))) =
                    tokio::time::timeout(Duration::from_secs(10), api.next_request()).await
                else {
                    break;
                };
                respond(
                    send,
                    503,
                    &status_failure(503, "ServiceUnavailable", "down"),
                );
            }
        });
        let result = tokio::time::timeout(Duration::from_secs(10), remove)
            .await
            .expect("removal bounded")
            .unwrap();
        assert!(result.is_err());
        timeout_after(Duration::from_secs(30), scenario).await;
    }

    #[tokio::test]
    async fn directory_answers_from_the_node_reflector_and_learned_targets() {
        let (client, mut api) = mock_client();
        let shutdown = CancellationToken::new();
        let scenario = tokio::spawn(async move {
            let (request, send) = api.expect(Method::GET, NODES).await;
            assert!(!query(&request).contains("watch=true"));
            respond(send, 200, &node_list(nodes_fixture()));
            let (request, send) = api.expect(Method::GET, NODES).await;
            assert!(query(&request).contains("watch=true"));
            send
        });
        let (directory, task) = NodePeerDirectory::spawn(client, shutdown.clone());
        assert!(
            tokio::time::timeout(Duration::from_secs(1), directory.wait_synced())
                .await
                .expect("synced within 1s")
        );
        let _watch = tokio::time::timeout(Duration::from_secs(1), scenario)
            .await
            .unwrap()
            .unwrap();

        assert_eq!(directory.peer_for(ip("10.244.1.5")), sock("10.0.0.1:7471"));
        assert_eq!(directory.peer_for(ip("fd00::2")), sock("[fd00::2]:7471"));
        assert_eq!(directory.peer_for(ip("172.16.0.9")), None);
        // The VMI watch saw 172.16.0.9 as node-b's target address before anyone published it.
        directory.learn(ip("172.16.0.9"), "node-b");
        assert_eq!(directory.peer_for(ip("172.16.0.9")), sock("[fd00::2]:7471"));
        // Learned beats annotations (they can be stale after a virt-handler restart).
        directory.learn(ip("10.244.1.5"), "node-b");
        assert_eq!(directory.peer_for(ip("10.244.1.5")), sock("[fd00::2]:7471"));

        // Only what lookups need is kept.
        let stored = directory
            .nodes
            .as_ref()
            .unwrap()
            .store()
            .get(&ObjectRef::new("node-a"))
            .unwrap();
        assert_eq!(stored.metadata.annotations.as_ref().unwrap().len(), 2);
        assert!(stored.metadata.labels.is_none() && stored.spec.is_none());
        assert!(stored.status.as_ref().unwrap().capacity.is_none());

        shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(1), task)
            .await
            .expect("directory stops on shutdown")
            .unwrap();
    }

    #[test]
    fn detached_directory_knows_nothing() {
        let directory = NodePeerDirectory::detached();
        directory.learn(ip("10.0.0.9"), "node-a");
        assert_eq!(directory.peer_for(ip("10.0.0.9")), None);
        assert!(directory.is_synced());
    }
}
