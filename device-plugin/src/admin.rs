//! The admin endpoint (`/live`, `/ready`, `/metrics`, shared in `rdma_streams_common::admin`):
//! ready when every pool is registered with kubelet or stands by for another instance.

use rdma_streams_common::admin::ReadinessReport;
pub use rdma_streams_common::admin::{BindError, bind, router, serve};

use crate::readiness::Readiness;

impl ReadinessReport for Readiness {
    fn report(&self) -> (bool, String) {
        let body: String = self
            .snapshot()
            .iter()
            .map(|(r, state)| format!("{r} {}\n", state.as_str()))
            .collect();
        let body = if body.is_empty() {
            "no pools\n".to_string()
        } else {
            body
        };
        (self.is_ready(), body)
    }
}
