//! The `v1beta1.DevicePlugin` gRPC service of one pool.
//!
//! State comes from a `watch` channel of [`PoolSnapshot`]s: every ListAndWatch stream owns its
//! own receiver, sends the full list at once, again on every change and again every resync
//! period, and ends when the server is restarted or the plugin drains. No stream can consume
//! an update meant for another (the bug behind k8s-rdma-shared-dev-plugin #48 and #74).

use std::{path::PathBuf, pin::Pin, sync::Arc};

use futures::Stream;
use rdma_streams_common::report::Report;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};
use tracing::{debug, info, warn};

use crate::{
    allocation::{
        allocate::{self, AllocateError, DeviceHandoff},
        pool::PoolSnapshot,
        preferred::preferred_allocation,
    },
    api::v1beta1::{self as pb, device_plugin_server::DevicePlugin},
    metrics::Metrics,
};

/// The options we advertise, in `RegisterRequest.options` and `GetDevicePluginOptions` alike.
pub fn plugin_options() -> pb::DevicePluginOptions {
    pb::DevicePluginOptions {
        pre_start_required: false,
        get_preferred_allocation_available: true,
    }
}

impl From<AllocateError> for Status {
    fn from(e: AllocateError) -> Self {
        match e {
            AllocateError::UnknownDevice { .. } | AllocateError::Empty { .. } => {
                Status::invalid_argument(e.to_string())
            }
            AllocateError::CharDeviceMissing { .. } => Status::failed_precondition(e.to_string()),
        }
    }
}

/// One pool's DevicePlugin service.
#[derive(Clone)]
pub struct PoolService {
    pub snapshot: watch::Receiver<Arc<PoolSnapshot>>,
    pub dev_root: PathBuf,
    pub handoff: DeviceHandoff,
    pub metrics: Metrics,
    /// Ends every stream of this server instance (restart or drain).
    pub stop: CancellationToken,
}

type DeviceStream = Pin<Box<dyn Stream<Item = Result<pb::ListAndWatchResponse, Status>> + Send>>;

/// Decrements the open-streams gauge when a stream ends, however it ends.
struct StreamGuard {
    metrics: Metrics,
    resource: String,
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        self.metrics
            .streams
            .get_or_create(&Metrics::resource(&self.resource))
            .dec();
        debug!(resource = %self.resource, "ListAndWatch stream ended");
    }
}

impl PoolService {
    fn resource(&self) -> String {
        self.snapshot.borrow().resource_name.clone()
    }

    fn list(snapshot: &PoolSnapshot) -> pb::ListAndWatchResponse {
        pb::ListAndWatchResponse {
            devices: snapshot.kubelet_devices(),
        }
    }
}

#[tonic::async_trait]
impl DevicePlugin for PoolService {
    async fn get_device_plugin_options(
        &self,
        _: Request<pb::Empty>,
    ) -> Result<Response<pb::DevicePluginOptions>, Status> {
        Ok(Response::new(plugin_options()))
    }

    type ListAndWatchStream = DeviceStream;

    async fn list_and_watch(
        &self,
        _: Request<pb::Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        let mut rx = self.snapshot.clone();
        let stop = self.stop.clone();
        let resource = self.resource();
        self.metrics
            .streams
            .get_or_create(&Metrics::resource(&resource))
            .inc();
        info!(%resource, "ListAndWatch stream opened");
        let guard = StreamGuard {
            metrics: self.metrics.clone(),
            resource,
        };
        let stream = async_stream::stream! {
            let _guard = guard;
            let (first, mut resync) = {
                let snap = rx.borrow_and_update();
                (Self::list(&snap), snap.resync)
            };
            yield Ok(first);
            loop {
                // Re-armed after every send: the period counts from the last full list.
                let resend = tokio::time::sleep(resync);
                tokio::select! {
                    biased;
                    _ = stop.cancelled() => break,
                    changed = rx.changed() => {
                        if changed.is_err() {
                            break;
                        }
                        let list = {
                            let snap = rx.borrow_and_update();
                            resync = snap.resync;
                            Self::list(&snap)
                        };
                        yield Ok(list);
                    }
                    () = resend => {
                        let list = Self::list(&rx.borrow());
                        yield Ok(list);
                    }
                }
            }
        };
        Ok(Response::new(Box::pin(stream)))
    }

    async fn get_preferred_allocation(
        &self,
        request: Request<pb::PreferredAllocationRequest>,
    ) -> Result<Response<pb::PreferredAllocationResponse>, Status> {
        let snapshot = self.snapshot.borrow().clone();
        let container_responses = request
            .into_inner()
            .container_requests
            .iter()
            .map(|c| {
                let size = usize::try_from(c.allocation_size).unwrap_or(0);
                let ids = preferred_allocation(
                    &snapshot,
                    &c.available_device_i_ds,
                    &c.must_include_device_i_ds,
                    size,
                );
                debug!(resource = %snapshot.resource_name, ?ids, "preferred allocation");
                pb::ContainerPreferredAllocationResponse { device_i_ds: ids }
            })
            .collect();
        Ok(Response::new(pb::PreferredAllocationResponse {
            container_responses,
        }))
    }

    async fn allocate(
        &self,
        request: Request<pb::AllocateRequest>,
    ) -> Result<Response<pb::AllocateResponse>, Status> {
        let started = std::time::Instant::now();
        let snapshot = self.snapshot.borrow().clone();
        let resource = snapshot.resource_name.clone();
        let result: Result<Vec<_>, AllocateError> = request
            .into_inner()
            .container_requests
            .iter()
            .map(|c| allocate::allocate(&snapshot, &c.devices_ids, &self.dev_root, &self.handoff))
            .collect();
        self.metrics
            .allocate_seconds
            .get_or_create(&Metrics::resource(&resource))
            .observe(started.elapsed().as_secs_f64());
        match result {
            Ok(container_responses) => {
                self.metrics
                    .allocations
                    .get_or_create(&Metrics::result(&resource, "ok"))
                    .inc();
                let devices: Vec<_> = container_responses
                    .iter()
                    .map(|r| {
                        r.envs
                            .get(allocate::DEVICES_ENV)
                            .cloned()
                            .unwrap_or_default()
                    })
                    .collect();
                info!(%resource, ?devices, "allocated");
                Ok(Response::new(pb::AllocateResponse {
                    container_responses,
                }))
            }
            Err(error) => {
                self.metrics
                    .allocations
                    .get_or_create(&Metrics::result(&resource, "error"))
                    .inc();
                warn!(%resource, error = %Report(&error), "Allocate refused");
                Err(error.into())
            }
        }
    }

    async fn pre_start_container(
        &self,
        _: Request<pb::PreStartContainerRequest>,
    ) -> Result<Response<pb::PreStartContainerResponse>, Status> {
        Ok(Response::new(pb::PreStartContainerResponse {}))
    }
}
