//! Compiles the vendored kubelet protos with protox (no system protoc) and tonic-prost-build.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "proto/deviceplugin/v1beta1/api.proto",
        "proto/pluginregistration/v1/api.proto",
    ];
    for f in &files {
        println!("cargo:rerun-if-changed={f}");
    }
    let fds = protox::compile(files, ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
