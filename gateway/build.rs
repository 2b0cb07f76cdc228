//! Generates the KubeVirt node hook service (our vendored proto; `rdma_streams_protogen`). The
//! client is generated too: the tests call the server with it.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    rdma_streams_protogen::compile(
        &["proto/kubevirt/hooks/plugins/v1alpha1/nodehook.proto"],
        "proto",
    )
}
