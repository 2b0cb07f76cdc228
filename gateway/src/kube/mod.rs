//! The gateway's Kubernetes side: which migrations this node must carry, and where the peer
//! gateways are.
//!
//! ```text
//!  API server                                   this gateway
//!  ----------                                   ------------
//!  VMIs labelled rdma-streams.io/migration=rdma
//!    status.migrationState ──watch──> vmi::watch_migrations ──MigrationEvent──> data path
//!                                          │ learns targetNodeAddress -> targetNode
//!                                          v
//!  Nodes (our annotations, addresses) ──reflector──> node::NodePeerDirectory::peer_for(ip)
//!                                                           ^ data path: "who serves ip?"
//!  Node <this node> <──merge patch── node::run_node_publisher (gateway ip:port,
//!                                     local virt-handler addresses; removed on shutdown)
//!
//!  virt-handler ──ExecuteNodeHook (unix socket)──> hooks_server ──hooks::event_for_hook──>
//!  (Plugins gate, alpha)     answered after the core acknowledged ──MigrationEvent──> data path
//! ```
//!
//! - [`vmi`]: the typed view of `kubevirt.io/v1` VirtualMachineInstances (only the fields we
//!   read), the pure [`vmi::events_for`] and the watch runner.
//! - [`node`]: the node annotations this gateway publishes and [`node::NodePeerDirectory`].
//! - [`virt_handler`]: the local virt-handler's addresses, read in its network namespace, for
//!   the `virt-handler-addresses` annotation.
//! - [`hooks`]: the pure adapter from one KubeVirt Plugin NodeHook call to
//!   [`crate::events::MigrationEvent`]; [`hooks_api`]: the generated gRPC types;
//!   [`hooks_server`]: the server on `--node-hooks-socket` that hands the event to the core and
//!   answers virt-handler once the capture is in place (always with success). Optional: the
//!   VMI watch alone starts the same migrations, only later.
//!
//! RBAC actually needed: `kubevirt.io/virtualmachineinstances` list+watch (get is not used),
//! `nodes` list+watch+patch (get is not used). The chart's `gateway-rbac.yaml` grants a superset.

pub(crate) mod hooks;
pub mod hooks_api;
pub(crate) mod hooks_server;
pub(crate) mod node;
pub(crate) mod virt_handler;
pub(crate) mod vmi;

/// Field manager of every write this gateway makes.
pub const FIELD_MANAGER: &str = "rdma-migration-gateway";
