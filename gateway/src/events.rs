//! What the gateway is told: migrations to carry, as the node's watchers see them.
//!
//! Producers (the VirtualMachineInstance watch, KubeVirt's node hooks, or the test hook
//! [`crate::test_events`]) send [`MigrationEvent`]s on a `tokio::sync::mpsc` channel that
//! [`crate::core::GatewayCore::run`] consumes.

/// One migration the gateway must carry, as the node's watchers see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Migration {
    /// The VMI's uid (the key of everything the gateway does for this migration).
    pub uid: String,
    /// namespace/name, for logs and metrics.
    pub vmi: String,
    /// This node's part in it.
    pub role: Role,
    /// The target virt-handler's migration address and the ports it published
    /// (status.migrationState.targetNodeAddress, targetDirectMigrationNodePorts keys).
    pub target: std::net::IpAddr,
    pub ports: Vec<u16>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Source,
    Target,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MigrationEvent {
    /// Program the capture (source) or expect streams (target) before the first connect.
    Started(Migration),
    /// Completed, failed or aborted: tear everything of this uid down.
    Ended { uid: String, aborted: bool },
}

impl Role {
    /// `source` or `target`, for logs and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Source => "source",
            Role::Target => "target",
        }
    }
}

impl Migration {
    /// True if `dst` is one of this migration's target ports on its target address.
    pub fn matches(&self, dst: std::net::SocketAddr) -> bool {
        dst.ip() == self.target && self.ports.contains(&dst.port())
    }
}
