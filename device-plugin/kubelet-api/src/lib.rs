//! kubelet's gRPC types and services, generated from the vendored protos in `proto/` by
//! `build.rs`: the device plugin API (both sides) and the plugin-watcher registration API.
//! Shared by the device plugin and the fake kubelet of its test kit.

/// Device plugin API `v1beta1`: `Registration` (kubelet) and `DevicePlugin` (ours).
pub mod v1beta1 {
    #![allow(missing_docs, clippy::all, clippy::pedantic)]
    tonic::include_proto!("v1beta1");
}

/// Plugin-watcher registration API.
pub mod pluginregistration {
    #![allow(missing_docs, clippy::all, clippy::pedantic)]
    tonic::include_proto!("pluginregistration");
}

/// The device plugin API version kubelet accepts.
pub const VERSION: &str = "v1beta1";
/// kubelet's own socket in `device-plugins/`.
pub const KUBELET_SOCKET: &str = "kubelet.sock";
/// kubelet's checkpoint file in `device-plugins/`, never deleted by a kubelet restart.
pub const KUBELET_CHECKPOINT: &str = "kubelet_internal_checkpoint";
/// `Device.health` values.
pub const HEALTHY: &str = "Healthy";
pub const UNHEALTHY: &str = "Unhealthy";
/// `PluginInfo.type` for device plugins.
pub const PLUGIN_TYPE_DEVICE_PLUGIN: &str = "DevicePlugin";
