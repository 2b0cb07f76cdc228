//! The injection actually performed: the profile after Pod Security adjustments.
//!
//! It is what the status hash covers, so two requests that would inject the same things get
//! the same hash, and a pod re-planned after a Pod Security downgrade gets a different one.

use std::collections::BTreeMap;

use serde::Serialize;

use super::opt_in::Mode;
use crate::profile::{NetworkSpec, Profile, ResourceSpec, ShimSpec};

/// What gets injected.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Effective {
    pub mode: &'static str,
    pub resource: ResourceSpec,
    /// `None` in migration mode.
    pub shim: Option<ShimSpec>,
    pub env: BTreeMap<String, String>,
    pub ipc_lock: bool,
    pub network: Option<NetworkSpec>,
    /// Pod Security `degrade` took something away.
    pub degraded: bool,
}

impl Effective {
    /// Everything the profile says, for an ordinary pod.
    pub(crate) fn app(profile: &Profile) -> Self {
        Self {
            mode: Mode::App.as_str(),
            resource: profile.resource.clone(),
            shim: Some(profile.shim.clone()),
            env: profile.env.clone(),
            ipc_lock: profile.ipc_lock,
            network: profile.network.clone(),
            degraded: false,
        }
    }

    /// A virt-launcher pod: only the resource (and the migration annotation). QEMU migrates over
    /// unix sockets and the gateway carries the bytes, so LD_PRELOAD, the shim volume, IPC_LOCK
    /// and the Multus network would change nothing but the attack surface; KubeVirt manages the
    /// launcher's networks itself.
    pub(crate) fn migration(profile: &Profile) -> Self {
        Self {
            mode: Mode::Migration.as_str(),
            resource: profile.resource.clone(),
            shim: None,
            env: BTreeMap::new(),
            ipc_lock: false,
            network: None,
            degraded: false,
        }
    }

    /// The shim; present in app mode.
    pub(crate) fn shim(&self) -> Option<&ShimSpec> {
        self.shim.as_ref()
    }
}
