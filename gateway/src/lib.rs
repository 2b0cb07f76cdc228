//! The migration gateway: KubeVirt live migrations over RDMA streams, KubeVirt unmodified.
//!
//! One gateway runs per node (host network, host PID). For a migration this node is the
//! source of, it enters the local virt-handler's network namespace and redirects (nftables)
//! only the TCP connections to the target virt-handler's migration address and ports to a
//! capture listener it opens there. Each captured connection becomes one RDMA stream to the
//! gateway of the target node, carried by the transport's stream engine (one event-loop
//! thread per process); the stream's connect request names the original destination, which
//! the peer gateway dials over plain TCP before it accepts. Any failure before the stream is
//! established (no peer gateway, no RDMA, a refusal, a timeout) relays that same connection
//! over TCP instead, counted with its reason.
//!
//! - [`events`]: what the gateway is told ([`events::MigrationEvent`]), by the kube watchers,
//!   KubeVirt's node hooks or an [`events::EventSource`] a program adds to the run (the test
//!   bed, `gateway/testbed`, feeds the gateway from a unix socket that way), and the
//!   acknowledgement a producer may wait for.
//! - [`core`]: [`core::GatewayCore`] consumes the events and owns every migration's state;
//!   [`ended`] remembers which migrations are over.
//! - Capture: [`netns`] (find and enter a network namespace), [`nft`] (per-migration
//!   tables), [`capture`] (the listener and `SO_ORIGINAL_DST`).
//! - Transport: [`peers`] (where the peer gateway is), [`payload`] (the connect request and
//!   its answer), [`outbound`] (source side), [`inbound`] (target side), [`stream`] (a TCP
//!   connection handed to the engine), [`relay`] (TCP fallback), [`fallback`] (reasons).
//! - Kubernetes: [`kube`] (the VirtualMachineInstance watch that produces the events, the node
//!   annotations that publish this gateway's address, the peer directory, and the KubeVirt node
//!   hook server that starts a migration before its first connect).
//! - Ops: [`metrics`], [`cli`] (the admin endpoint and the runtime are
//!   `rdma_streams_common`'s).

pub mod capture;
pub mod cli;
pub mod core;
pub mod ended;
pub mod events;
pub mod fallback;
pub mod inbound;
pub mod kube;
pub mod metrics;
pub mod netns;
pub mod nft;
pub mod outbound;
pub mod payload;
pub mod peers;
pub mod relay;
pub mod stream;
#[cfg(test)]
mod testing;
