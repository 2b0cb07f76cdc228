//! Pieces shared by the rdma-streams binaries.

pub mod admin;
pub mod reload_metrics;
pub mod shutdown;
pub mod telemetry;
pub mod watched_file;
