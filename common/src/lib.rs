//! Pieces shared by the rdma-streams binaries.

pub mod admin;
pub mod args;
pub mod atomic_file;
pub mod backoff;
pub mod file_id;
#[cfg(feature = "kube")]
pub mod kube;
pub mod names;
pub mod reload_metrics;
pub mod report;
pub mod runtime;
pub mod telemetry;
#[cfg(feature = "uds")]
pub mod uds;
pub mod watched_file;
