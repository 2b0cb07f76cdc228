//! The kubelet side: one gRPC server per pool on kubelet's device plugin folder, registered
//! with kubelet, restarted whenever kubelet loses it.
//!
//! ```text
//!  manager: one runner per configured pool, fed PoolSnapshots
//!    runner: instance_lock -> serve service on a fresh socket (resource_name) -> registration
//!            -> watch the folder (dir_watch) -> start over
//! ```
//!
//! The wire types are `crate::api` (the `rdma-kubelet-api` crate).

mod dir_watch;
pub mod instance_lock;
pub(crate) mod manager;
pub(crate) mod registration;
mod resource_name;
pub(crate) mod runner;
mod service;
