//! Readiness: the plugin is ready when every configured pool is registered with kubelet.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex, PoisonError},
};

/// Shared registration state of the pools, read by `/ready`.
#[derive(Clone, Debug, Default)]
pub struct Readiness {
    pools: Arc<Mutex<BTreeMap<String, bool>>>,
}

impl Readiness {
    pub fn set(&self, resource: &str, registered: bool) {
        self.pools
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(resource.to_string(), registered);
    }

    pub fn remove(&self, resource: &str) {
        self.pools
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(resource);
    }

    pub fn is_registered(&self, resource: &str) -> bool {
        self.pools
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(resource)
            .copied()
            .unwrap_or(false)
    }

    /// Ready: at least one pool, all registered.
    pub fn is_ready(&self) -> bool {
        let pools = self.pools.lock().unwrap_or_else(PoisonError::into_inner);
        !pools.is_empty() && pools.values().all(|r| *r)
    }

    /// `resource -> registered`, for the `/ready` body.
    pub fn snapshot(&self) -> BTreeMap<String, bool> {
        self.pools
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}
