//! Registering a pool with kubelet: the `kubelet.sock` Register call and the plugin-watcher
//! `pluginregistration.Registration` service, and the retry backoff both share.

use std::{path::Path, time::Duration};

use rdma_streams_common::backoff::Backoff;
use tokio::sync::mpsc;
use tonic::{Request, Response, Status};
use tracing::{info, warn};

use super::service::plugin_options;
use crate::api::{
    self, pluginregistration as pr,
    v1beta1::{self as pb, registration_client::RegistrationClient},
};

/// How long one Register call (connect included) may take.
pub const REGISTER_TIMEOUT: Duration = Duration::from_secs(5);

/// How registration is done (`--registration`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum RegistrationMode {
    /// Call `Register` on `<kubelet-root>/device-plugins/kubelet.sock` (documented, universal).
    KubeletSock,
    /// Put a socket in `<kubelet-root>/plugins_registry/` and let kubelet's plugin watcher
    /// call `GetInfo` / `NotifyRegistrationStatus`.
    PluginWatcher,
}

#[derive(Debug, thiserror::Error)]
pub enum RegistrationError {
    #[error("connecting to kubelet at {path}")]
    Connect {
        path: String,
        #[source]
        source: tonic::transport::Error,
    },
    #[error("kubelet rejected the registration")]
    Rejected(#[source] Status),
}

/// Calls `Register` on kubelet's socket for `resource_name`, served at `endpoint` (a bare file
/// name in kubelet's socket folder).
pub async fn register(
    kubelet_socket: &Path,
    resource_name: &str,
    endpoint: &str,
) -> Result<(), RegistrationError> {
    let channel = crate::uds::channel(kubelet_socket, REGISTER_TIMEOUT, Some(REGISTER_TIMEOUT))
        .await
        .map_err(|source| RegistrationError::Connect {
            path: kubelet_socket.display().to_string(),
            source,
        })?;
    RegistrationClient::new(channel)
        .register(pb::RegisterRequest {
            version: api::VERSION.to_string(),
            endpoint: endpoint.to_string(),
            resource_name: resource_name.to_string(),
            options: Some(plugin_options()),
        })
        .await
        .map_err(RegistrationError::Rejected)?;
    Ok(())
}

/// The delays between registration attempts: 100 ms doubling to 5 s, reset once registered.
pub fn retry_backoff() -> Backoff {
    Backoff::new(Duration::from_millis(100), Duration::from_secs(5))
}

/// What kubelet's plugin watcher told us.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WatcherStatus {
    Registered,
    Failed(String),
}

/// The `pluginregistration.Registration` service for one pool (plugin-watcher mode).
#[derive(Clone)]
pub struct WatcherRegistration {
    pub resource_name: String,
    /// Full path of the socket serving the DevicePlugin service.
    pub endpoint: String,
    pub status: mpsc::UnboundedSender<WatcherStatus>,
}

#[tonic::async_trait]
impl pr::registration_server::Registration for WatcherRegistration {
    async fn get_info(
        &self,
        _: Request<pr::InfoRequest>,
    ) -> Result<Response<pr::PluginInfo>, Status> {
        info!(resource = %self.resource_name, "plugin watcher asked GetInfo");
        Ok(Response::new(pr::PluginInfo {
            r#type: api::PLUGIN_TYPE_DEVICE_PLUGIN.to_string(),
            name: self.resource_name.clone(),
            endpoint: self.endpoint.clone(),
            supported_versions: vec![api::VERSION.to_string()],
        }))
    }

    async fn notify_registration_status(
        &self,
        request: Request<pr::RegistrationStatus>,
    ) -> Result<Response<pr::RegistrationStatusResponse>, Status> {
        let status = request.into_inner();
        let status = if status.plugin_registered {
            WatcherStatus::Registered
        } else {
            warn!(resource = %self.resource_name, error = %status.error, "kubelet reported a failed registration");
            WatcherStatus::Failed(status.error)
        };
        // The runner may be restarting; a closed channel only means nobody waits any more.
        let _ = self.status.send(status);
        Ok(Response::new(pr::RegistrationStatusResponse {}))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_start_at_100_ms_and_double_to_5_s() {
        let mut b = retry_backoff();
        let seq: Vec<_> = (0..8).map(|_| b.next_delay().as_millis()).collect();
        assert_eq!(seq, [100, 200, 400, 800, 1600, 3200, 5000, 5000]);
        b.reset();
        assert_eq!(b.next_delay(), Duration::from_millis(100));
    }

    #[tokio::test]
    async fn a_missing_kubelet_socket_is_reported_with_its_errno() {
        let dir = tempfile::tempdir().expect("tempdir");
        let socket = dir.path().join("kubelet.sock");
        let error = register(&socket, "rdma-streams.io/hca", "rdma.sock")
            .await
            .expect_err("no kubelet");
        assert_eq!(
            rdma_streams_common::report::Report(&error).to_string(),
            format!(
                "connecting to kubelet at {}: transport error: No such file or directory (os error 2)",
                socket.display()
            )
        );
    }
}
