//! rdma-device-plugin: advertises RDMA HCAs to kubelet as per-HCA slots.
//!
//! ```text
//!  sysfs + dev tree --discovery--> Inventory --(per pool)--> PoolSnapshot --watch--> gRPC service
//!  config file -----config_watch--> Config ------^                                  (ListAndWatch,
//!  kubelet dir --dir_watch--> runner: lock, serve fresh socket, Register, restart    Allocate, ...)
//! ```
//!
//! One concept per module; `cli` wires them together.

pub mod allocate;
pub use rdma_kubelet_api as api;
pub mod cdi;
pub mod cli;
pub mod config;
pub mod config_watch;
pub mod dir_watch;
pub mod discovery;
pub mod hca;
pub mod health;
pub mod instance_lock;
pub mod inventory_watch;
pub mod manager;
pub mod metrics;
pub mod netns_mode;
pub mod pool;
pub mod preferred;
pub mod registration;
pub mod resource_name;
pub mod runner;
pub mod selector;
pub mod service;
pub use rdma_streams_common::uds;
pub mod verbs;
