//! The admin endpoint (`/live`, `/ready`, `/metrics`, shared in `rdma_streams_common::admin`):
//! ready once the event sources and (when RDMA is usable) the stream listener are up.

use std::sync::{
    Arc,
    atomic::{AtomicBool, Ordering},
};

use rdma_streams_common::admin::ReadinessReport;
pub use rdma_streams_common::admin::{BindError, bind, router, serve};

/// Ready once the event sources and (when RDMA is usable) the stream listener are up.
#[derive(Clone, Debug, Default)]
pub struct Readiness(Arc<AtomicBool>);

impl Readiness {
    pub fn set(&self, ready: bool) {
        self.0.store(ready, Ordering::Release);
    }

    pub fn is_ready(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

impl ReadinessReport for Readiness {
    fn report(&self) -> (bool, String) {
        if self.is_ready() {
            (true, "ready\n".to_string())
        } else {
            (false, "not ready\n".to_string())
        }
    }
}
