//! Generates kubelet's device plugin and registration services from the vendored protos
//! (`rdma_streams_protogen`).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    rdma_streams_protogen::compile(
        &[
            "proto/deviceplugin/v1beta1/api.proto",
            "proto/pluginregistration/v1/api.proto",
        ],
        "proto",
    )
}
