//! Unit-test fixtures shared by the modules' tests: a runtime under a hard timeout, a core
//! without capture namespace or provider, and a namespace lookup that counts its calls.

use std::{
    future::Future,
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use crate::{
    core::{GatewayCore, Settings, Shared},
    fallback::Fallback,
    metrics::Metrics,
    netns::{NetnsError, NetnsLocator},
    peers::StaticPeers,
};

/// Runs an async test body on its own runtime, failing after `limit`.
pub fn within<F>(limit: Duration, body: impl FnOnce() -> F + Send + 'static)
where
    F: Future<Output = ()>,
{
    rdma_streams_testkit::within(limit, move || {
        tokio::runtime::Runtime::new()
            .expect("runtime")
            .block_on(body())
    });
}

/// A capture namespace lookup that takes `delay`, then fails, counting its calls: every source
/// `Started` the core acts on calls it once (the capture attempt), so the count tells how
/// often the capture was programmed.
#[derive(Debug, Clone, Default)]
pub struct CountingLocator {
    pub delay: Duration,
    pub calls: Arc<AtomicUsize>,
}

impl CountingLocator {
    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

impl NetnsLocator for CountingLocator {
    fn locate(&self) -> Result<PathBuf, NetnsError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        std::thread::sleep(self.delay);
        Err(NetnsError::Locate("test: no capture namespace".into()))
    }
}

/// A core with no provider, no peers and `locator` for capture.
pub fn core_with(locator: impl NetnsLocator) -> GatewayCore {
    GatewayCore::new(Arc::new(Shared::new(
        Err(Fallback::NoProvider),
        Arc::new(StaticPeers::default()),
        Arc::new(locator),
        Metrics::default(),
        Settings::default(),
    )))
}
