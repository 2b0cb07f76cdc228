//! `rdma-device-plugin`: see the library crate for everything.

use std::{io::Write, process::ExitCode};

use rdma_streams_common::report::Report;

fn main() -> ExitCode {
    match rdma_device_plugin::cli::Args::parse_and_run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!(error = %Report(&error), "rdma-device-plugin failed");
            // Also plainly on stderr, in case logging is filtered (never panicking on a
            // closed pipe, unlike eprintln!).
            let _ = writeln!(std::io::stderr(), "rdma-device-plugin: {}", Report(&error));
            ExitCode::FAILURE
        }
    }
}
