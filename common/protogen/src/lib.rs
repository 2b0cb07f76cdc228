//! What the build scripts of the crates with gRPC services share: compile vendored `.proto`
//! files with protox (pure Rust, no system `protoc`) and generate tonic client and server code
//! with tonic-prost-build into `OUT_DIR`, for `tonic::include_proto!`.
//!
//! ```no_run
//! // build.rs
//! fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     rdma_streams_protogen::compile(&["proto/example/v1/api.proto"], "proto")
//! }
//! ```

/// Compiles `files` (paths relative to the crate, found under the include root `include`) and
/// generates both the client and the server of every service: each crate's tests call its own
/// servers with the generated clients. Cargo reruns the build script when a file changes.
#[allow(
    clippy::print_stdout,
    reason = "a build script talks to cargo on stdout"
)]
pub fn compile(files: &[&str], include: &str) -> Result<(), Box<dyn std::error::Error>> {
    for file in files {
        println!("cargo:rerun-if-changed={file}");
    }
    let descriptors = protox::compile(files, [include])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(descriptors)?;
    Ok(())
}
