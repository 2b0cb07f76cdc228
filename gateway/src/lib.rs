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
//! ```text
//!   kube (VMI watch, node hooks)        an EventSource a program adds (the test bed's socket)
//!              \                        /
//!               v                      v
//!            events ──EventDelivery──> migration::GatewayCore ──> capture (netns, nft, listener)
//!                                        │ source: captured connections ──┐
//!                                        │ target: streams from peers ────┤
//!                                        v                                v
//!                                      Shared state           streams (peers, payload, outbound,
//!                                                               stream, relay, Fallback)
//! ```
//!
//! - [`events`]: what the gateway is told ([`events::MigrationEvent`]), by the kube watchers,
//!   KubeVirt's node hooks or an [`events::EventSource`] a program adds to the run (the test
//!   bed, `gateway/testbed`, feeds the gateway from a unix socket that way), and the
//!   acknowledgement a producer may wait for.
//! - `migration/`: `GatewayCore` consumes the events and owns every migration's state
//!   (`state`: what a migration's connections share; `ended`: which migrations are over); a
//!   migration's connections by role: `source` (captured here, carried over a stream or relayed
//!   over TCP) and `target` (the stream listener: streams from peers, dialed to their
//!   destination).
//! - `capture/` (source role, knows no migration state): `netns` (find and enter a network
//!   namespace), `nft` (per-migration tables), `listener` (the capture listener and
//!   `SO_ORIGINAL_DST`).
//! - `streams/` (what the gateways speak, knows no migration state): `peers` (where the peer
//!   gateway is: `PeerLookup`), `payload` (the connect request and its answer), `outbound`
//!   (opening a stream), `stream` (a TCP connection handed to the engine), `relay` (TCP
//!   fallback), `fallback` (reasons).
//! - Kubernetes: [`kube`] (the VirtualMachineInstance watch that produces the events, the node
//!   annotations that publish this gateway's address, the cluster's peer directory, and the
//!   KubeVirt node hook server that starts a migration before its first connect).
//! - Ops: `metrics`, [`cli`] (parse, plan, run; the admin endpoint and the runtime are
//!   `rdma_streams_common`'s).
//!
//! Public: [`cli`] (the binaries), [`events`] (event sources), [`kube::hooks_api`] (the node
//! hook's gRPC types, for tests that play virt-handler); everything else is the crate's own.
//! No module cycle: capture and streams are leaves, migration uses them, kube and cli sit on
//! top.

mod capture;
pub mod cli;
#[cfg(test)]
mod docs_tests;
pub mod events;
pub mod kube;
mod metrics;
mod migration;
mod streams;
#[cfg(test)]
mod testing;
