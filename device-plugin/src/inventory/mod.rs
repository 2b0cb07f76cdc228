//! What the node has: its RDMA devices, read from a sysfs and a dev tree.
//!
//! ```text
//!  sysfs + dev tree --discovery--> Inventory (hca: HCAs, ports, char devices, netns mode)
//!                                     ^ health: reasons from what was read
//!                                     ^ verbs: libibverbs' port states (second source)
//!  watch: rediscover every interval, publish the Inventory when it changed
//! ```
//!
//! It knows nothing of pools, config or kubelet.

pub(crate) mod discovery;
pub(crate) mod hca;
mod health;
pub(crate) mod netns_mode;
mod verbs;
pub(crate) mod watch;
