//! rdma-device-plugin: advertises RDMA HCAs to kubelet as per-HCA slots.
//!
//! ```text
//!              inventory/                 allocation/                    kubelet/
//!  sysfs + dev tree --discovery--> Inventory --(per pool)--> PoolSnapshot --watch--> manager
//!                   (health, verbs, watch)         ^   (pool, allocate,             runner: lock, serve
//!                                                  |    preferred, cdi)             service on a fresh
//!  config file -----watch--> Config (selector) ----'                                socket, register,
//!              config/                                                              restart (dir_watch)
//! ```
//!
//! Each folder depends only on those to its left (and on `metrics`): `inventory` knows the node,
//! `config` the file, `allocation` what a pool hands out, `kubelet` the protocol and sockets.
//! `cli` wires them together. The kubelet wire types are [`api`] (the `rdma-kubelet-api` crate);
//! the test doubles are in `rdma-device-plugin-testkit`, a dev-dependency only.

mod allocation;
pub mod cli;
pub mod config;
mod inventory;
mod kubelet;
mod metrics;

pub use kubelet::instance_lock;
pub use rdma_kubelet_api as api;
pub use rdma_streams_common::uds;
