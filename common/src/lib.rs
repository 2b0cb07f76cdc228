//! Pieces shared by the rdma-streams binaries.

pub mod watched_file;
