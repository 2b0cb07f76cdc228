//! Compiles our KubeVirt node hook proto with protox (no system protoc) and tonic-prost-build.
//! The client is generated too: the tests call the server with it.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = ["proto/kubevirt/hooks/plugins/v1alpha1/nodehook.proto"];
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
