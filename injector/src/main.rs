//! `rdma-stream-injector`: see the library crate.

use std::{io::Write, process::ExitCode};

use rdma_streams_common::report::Report;

fn main() -> ExitCode {
    // rustls needs one process-wide crypto provider (ring, pure Rust + asm, no C toolchain).
    let _ = rustls::crypto::ring::default_provider().install_default();
    match rdma_stream_injector::cli::Args::parse_and_run() {
        Ok(code) => code,
        Err(error) => {
            tracing::error!(error = %Report(&error), "rdma-stream-injector failed");
            let _ = writeln!(
                std::io::stderr(),
                "rdma-stream-injector: {}",
                Report(&error)
            );
            ExitCode::FAILURE
        }
    }
}
