//! What the gateway is told: migrations to carry, as the node's watchers see them.
//!
//! Producers (the VirtualMachineInstance watch, KubeVirt's node hooks, or an [`EventSource`] a
//! program adds to its run, as the test bed does) send [`MigrationEvent`]s, each in an [`EventDelivery`], on a
//! `tokio::sync::mpsc` channel that [`crate::migration::GatewayCore::run`] consumes. A producer that
//! must not go on before the event took effect (the node hook server: virt-handler connects as
//! soon as it answers) asks for an acknowledgement with [`EventDelivery::acknowledged`] and awaits
//! the [`Handled`] outcome; the others send `EventDelivery::from(event)` and move on.

use std::future::Future;

use futures::future::BoxFuture;
use rdma_streams_common::runtime::{TaskError, TaskOutput};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

/// One migration the gateway must carry, as the node's watchers see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Migration {
    /// The VMI's uid (the key of everything the gateway does for this migration).
    pub uid: String,
    /// Which of the VMI's migrations this is: `status.migrationState.migrationUid` (its start
    /// time on KubeVirt without one); empty when the producer does not know (the test bed's events).
    pub id: String,
    /// namespace/name, for logs and metrics.
    pub vmi: String,
    /// This node's part in it.
    pub role: Role,
    /// The target virt-handler's migration address and the ports it published
    /// (status.migrationState.targetNodeAddress, targetDirectMigrationNodePorts keys).
    pub target: std::net::IpAddr,
    pub ports: Vec<u16>,
    /// `status.migrationState.startTimestamp` (RFC 3339, UTC), which orders the migrations of
    /// one VMI; `None` when the producer does not know it (the test bed's events).
    pub started: Option<String>,
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
    /// True if this migration started before `other` did, by their start times; false when
    /// either time is unknown or not in the API server's form (`2026-11-30T05:00:00Z`, which
    /// sorts as text).
    pub fn started_before(&self, other: &Migration) -> bool {
        fn canonical(t: &str) -> bool {
            let b = t.as_bytes();
            b.len() == 20
                && b[19] == b'Z'
                && b[10] == b'T'
                && b.iter()
                    .enumerate()
                    .all(|(i, c)| matches!(i, 4 | 7 | 10 | 13 | 16 | 19) || c.is_ascii_digit())
        }
        match (self.started.as_deref(), other.started.as_deref()) {
            (Some(a), Some(b)) if canonical(a) && canonical(b) => a < b,
            _ => false,
        }
    }

    /// True if `dst` is one of this migration's target ports on its target address.
    pub fn matches(&self, dst: std::net::SocketAddr) -> bool {
        dst.ip() == self.target && self.ports.contains(&dst.port())
    }
}

/// A [`MigrationEvent`] on its way to the core, with an optional acknowledgement.
#[derive(Debug)]
pub struct EventDelivery {
    pub event: MigrationEvent,
    /// Completed with the outcome once the core has handled the event (for a source `Started`:
    /// capture installed, or failed). Dropped unanswered when the core stops first.
    pub handled: Option<oneshot::Sender<Handled>>,
}

impl EventDelivery {
    /// `event` with an acknowledgement, and the receiver of that acknowledgement.
    pub fn acknowledged(event: MigrationEvent) -> (EventDelivery, oneshot::Receiver<Handled>) {
        let (tx, rx) = oneshot::channel();
        (
            EventDelivery {
                event,
                handled: Some(tx),
            },
            rx,
        )
    }
}

impl From<MigrationEvent> for EventDelivery {
    /// Fire and forget: nobody waits for the outcome.
    fn from(event: MigrationEvent) -> EventDelivery {
        EventDelivery {
            event,
            handled: None,
        }
    }
}

/// A producer of events a program adds to a run of the gateway ([`crate::cli::Args::run_with`],
/// [`crate::cli::serve`]), beside the cluster's: started once the core is about to consume
/// the channel, it runs as a named task of the gateway's runtime until `shutdown`.
pub struct EventSource {
    name: String,
    start: StartSource,
}

/// A source's running part: the events channel and the shutdown token in, its task out.
type StartSource =
    Box<dyn FnOnce(mpsc::Sender<EventDelivery>, CancellationToken) -> SourceTask + Send>;

/// What an [`EventSource`] runs.
type SourceTask = BoxFuture<'static, Result<(), TaskError>>;

impl EventSource {
    /// A source named `name` (its task's name): `start` gets the events channel and the
    /// shutdown token and returns the future that produces.
    pub fn new<F, Fut>(name: impl Into<String>, start: F) -> EventSource
    where
        F: FnOnce(mpsc::Sender<EventDelivery>, CancellationToken) -> Fut + Send + 'static,
        Fut: Future + Send + 'static,
        Fut::Output: TaskOutput,
    {
        EventSource {
            name: name.into(),
            start: Box::new(move |events, shutdown| {
                let future = start(events, shutdown);
                Box::pin(async move { future.await.into_result() })
            }),
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The source's task, feeding `events` until `shutdown`.
    pub fn start(
        self,
        events: mpsc::Sender<EventDelivery>,
        shutdown: CancellationToken,
    ) -> (String, SourceTask) {
        (self.name, (self.start)(events, shutdown))
    }
}

impl std::fmt::Debug for EventSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventSource")
            .field("name", &self.name)
            .finish_non_exhaustive()
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

#[cfg(test)]
mod tests {
    use super::*;

    fn at(started: Option<&str>) -> Migration {
        Migration {
            uid: "u1".into(),
            id: "m".into(),
            vmi: "ns/vm".into(),
            role: Role::Source,
            target: "10.2.0.2".parse().unwrap(),
            ports: vec![1],
            started: started.map(Into::into),
        }
    }

    #[test]
    fn start_times_order_migrations_only_when_both_are_known_and_canonical() {
        let early = at(Some("2026-11-30T05:00:00Z"));
        let late = at(Some("2026-11-30T05:00:01Z"));
        assert!(early.started_before(&late));
        assert!(!late.started_before(&early));
        assert!(!early.started_before(&early), "same second: not before");
        assert!(!at(None).started_before(&late));
        assert!(!early.started_before(&at(None)));
        // Another offset or fractions do not sort as text: no order claimed.
        assert!(!at(Some("2026-11-30T04:00:00-02:00")).started_before(&late));
        assert!(!at(Some("2026-11-30T05:00:00.5Z")).started_before(&late));
        assert!(!at(Some("not a time at all..Z")).started_before(&late));
    }
}
