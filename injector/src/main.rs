//! `rdma-stream-injector`: see the library crate.

fn main() -> std::process::ExitCode {
    // rustls needs one process-wide crypto provider (ring, pure Rust + asm, no C toolchain).
    let _ = rustls::crypto::ring::default_provider().install_default();
    rdma_streams_common::report::exit(
        "rdma-stream-injector",
        rdma_stream_injector::cli::Args::parse_and_run(),
    )
}
