//! What the gateway is told: migrations to carry, as the node's watchers see them.
//!
//! Producers (the VirtualMachineInstance watch, KubeVirt's node hooks, or the test hook
//! [`crate::test_events`]) send [`MigrationEvent`]s, each in a [`Delivery`], on a
//! `tokio::sync::mpsc` channel that [`crate::core::GatewayCore::run`] consumes. A producer that
//! must not go on before the event took effect (the node hook server: virt-handler connects as
//! soon as it answers) asks for an acknowledgement with [`Delivery::acknowledged`] and awaits
//! the [`Handled`] outcome; the others send `Delivery::from(event)` and move on.

use tokio::sync::oneshot;

/// One migration the gateway must carry, as the node's watchers see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Migration {
    /// The VMI's uid (the key of everything the gateway does for this migration).
    pub uid: String,
    /// Which of the VMI's migrations this is: `status.migrationState.migrationUid` (its start
    /// time on KubeVirt without one); empty when the producer does not know (test events).
    pub id: String,
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
    /// Completed, failed or aborted: tear everything of this uid down; with `migration`, only
    /// if the active migration of `uid` is that one (a producer reporting the end of a
    /// migration it may never have seen start, or an older one than another trigger started).
    Ended {
        uid: String,
        aborted: bool,
        migration: Option<String>,
    },
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

/// A [`MigrationEvent`] on its way to the core, with an optional acknowledgement.
#[derive(Debug)]
pub struct Delivery {
    pub event: MigrationEvent,
    /// Completed with the outcome once the core has handled the event (for a source `Started`:
    /// capture installed, or failed). Dropped unanswered when the core stops first.
    pub handled: Option<oneshot::Sender<Handled>>,
}

impl Delivery {
    /// `event` with an acknowledgement, and the receiver of that acknowledgement.
    pub fn acknowledged(event: MigrationEvent) -> (Delivery, oneshot::Receiver<Handled>) {
        let (tx, rx) = oneshot::channel();
        (
            Delivery {
                event,
                handled: Some(tx),
            },
            rx,
        )
    }
}

impl From<MigrationEvent> for Delivery {
    /// Fire and forget: nobody waits for the outcome.
    fn from(event: MigrationEvent) -> Delivery {
        Delivery {
            event,
            handled: None,
        }
    }
}

/// What handling one event did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handled {
    /// A migration started: capture installed (source) or streams expected (target).
    Started,
    /// The same migration was already active (another trigger reported it first): nothing
    /// changed.
    AlreadyStarted,
    /// A source migration started but its capture could not be installed: its connections go
    /// over TCP without the gateway.
    Uncaptured,
    /// A start of a migration that already ended, or that a newer migration of its VMI
    /// replaced (a late report): ignored, nothing changed.
    Stale,
    /// The migration ended (or was not active: nothing to do).
    Ended,
}
