//! `rdma-migration-gateway`: see the library crate.

use std::{io::Write, process::ExitCode};

use rdma_streams_common::report::Report;

fn main() -> ExitCode {
    match rdma_migration_gateway::cli::Args::parse_and_run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!(error = %Report(&error), "rdma-migration-gateway failed");
            let _ = writeln!(
                std::io::stderr(),
                "rdma-migration-gateway: {}",
                Report(&error)
            );
            ExitCode::FAILURE
        }
    }
}
