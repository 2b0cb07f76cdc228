//! Readiness: the plugin is ready when every configured pool is registered with kubelet, or
//! stands by because another instance on the node serves it ([`crate::instance_lock`]; ready,
//! so that a DaemonSet rollout with `maxSurge` can go on and end the old instance).

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex, PoisonError},
};

/// Shared registration state of the pools, read by `/ready`.
#[derive(Clone, Debug, Default)]
pub struct Readiness {
    pools: Arc<Mutex<BTreeMap<String, PoolState>>>,
}

/// Where one pool stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolState {
    NotRegistered,
    Registered,
    /// Another instance on this node holds the pool's lock and serves it.
    Standby,
}

impl PoolState {
    pub fn as_str(self) -> &'static str {
        match self {
            PoolState::NotRegistered => "not registered",
            PoolState::Registered => "registered",
            PoolState::Standby => "standby (another instance on this node serves it)",
        }
    }
}

impl Readiness {
    pub fn set_state(&self, resource: &str, state: PoolState) {
        self.pools
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(resource.to_string(), state);
    }

    pub fn remove(&self, resource: &str) {
        self.pools
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(resource);
    }

    /// Ready: at least one pool, each registered or standing by.
    pub fn is_ready(&self) -> bool {
        let pools = self.pools.lock().unwrap_or_else(PoisonError::into_inner);
        !pools.is_empty() && pools.values().all(|s| *s != PoolState::NotRegistered)
    }

    /// `resource -> state`, for the `/ready` body.
    pub fn snapshot(&self) -> BTreeMap<String, PoolState> {
        self.pools
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}
