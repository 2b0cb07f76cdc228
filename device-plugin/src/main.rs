//! `rdma-device-plugin`: see the library crate for everything.

fn main() -> std::process::ExitCode {
    rdma_streams_common::report::exit(
        "rdma-device-plugin",
        rdma_device_plugin::cli::Args::parse_and_run(),
    )
}
