//! `rdma-migration-gateway`: see the library crate.

use std::{io::Write, process::ExitCode};

fn main() -> ExitCode {
    match rdma_migration_gateway::cli::Args::parse_and_run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!(%error, "rdma-migration-gateway failed");
            let _ = writeln!(std::io::stderr(), "rdma-migration-gateway: {error}");
            ExitCode::FAILURE
        }
    }
}
