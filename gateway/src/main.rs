//! `rdma-migration-gateway`: see the library crate.

fn main() -> std::process::ExitCode {
    rdma_streams_common::report::exit(
        "rdma-migration-gateway",
        rdma_migration_gateway::cli::Args::parse_and_run(),
    )
}
