//! What a migration's connections share with the core: the stream engine, the peers, the
//! capture namespace, the metrics, the settings, and the table of active migrations
//! ([`Shared`]); the handles one migration's connections hold ([`Handles`]).

use std::{
    collections::HashMap,
    net::{IpAddr, SocketAddr},
    sync::{Arc, Mutex},
    time::Duration,
};

use rdma_streams_transport::Engine;
use tokio_util::{sync::CancellationToken, task::TaskTracker};

use super::ended::EndedMigrations;
use crate::{
    capture::{netns::NetnsLocator, nft::OwnedTable},
    events::{Migration, Role},
    metrics::Metrics,
    streams::{
        Fallback, PeerLookup, challenges::Challenges, keys::KeyRing, keys::PeerKeys,
        payload::UidDigest,
    },
};

/// Mark on the gateway's own sockets (`RGMW`): capture rules skip marked connections.
pub const DEFAULT_MARK: u32 = 0x5247_4d57;

/// Tunables.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Bound on opening a stream: the RDMA connect and the peer's answer (the peer dials the
    /// TCP destination before it answers).
    pub stream_timeout: Duration,
    /// Bound on TCP dials (fallback and the peer's dial of the original destination).
    pub dial_timeout: Duration,
    /// `SO_MARK` of the gateway's own sockets (0: none).
    pub mark: u32,
    /// Bytes of each stream's ring per direction (the engine's `ring_bytes`; the same on every
    /// stream of the process). Default: the engine's, 2 MiB.
    pub ring_bytes: usize,
    /// The address streams are opened from (the gateway's `--listen` address when it names
    /// one; else the kernel's choice for the route to the peer).
    pub stream_source: Option<IpAddr>,
    /// How long connections of a migration that ended without an abort may still run.
    pub drain_grace: Duration,
    /// The node address this gateway advertises (`--advertise-address`): a target may dial
    /// it besides virt-handler's own addresses (a virt-handler on the host network).
    pub advertised: Option<IpAddr>,
}

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            stream_timeout: Duration::from_secs(2),
            dial_timeout: Duration::from_secs(5),
            mark: DEFAULT_MARK,
            ring_bytes: rdma_streams_transport::engine::DEFAULT_RING,
            stream_source: None,
            drain_grace: Duration::from_secs(10),
            advertised: None,
        }
    }
}

/// The process's stream engine, or why this node has none (every connection then goes over
/// TCP with that reason).
pub type RdmaState = Result<Engine, Fallback>;

/// What the connection handlers share.
pub struct Shared {
    pub rdma: RdmaState,
    pub peers: Arc<dyn PeerLookup>,
    pub locator: Arc<dyn NetnsLocator>,
    pub metrics: Metrics,
    pub settings: Settings,
    /// The peer keys in force (none: no stream is opened or accepted).
    pub keys: KeyRing,
    /// The challenges this gateway issued as a target ([`crate::streams::challenges`]).
    challenges: Mutex<Challenges>,
    migrations: Mutex<HashMap<String, Active>>,
    /// Migrations that ended or were replaced; only the core's event loop touches it.
    ended: Mutex<EndedMigrations>,
    /// Every migration's connections and capture listener: shutdown waits for them.
    tasks: TaskTracker,
    /// Parent of every migration's `cancel`: the core cancels it when it stops, which also
    /// ends the connections of migrations still in their drain grace.
    pub(super) stop: CancellationToken,
}

/// One migration's live state.
pub(super) struct Active {
    pub(super) migration: Migration,
    /// The uid's digest, as a peer's connect request names it.
    pub(super) digest: UidDigest,
    /// Cancelled at the end (or after the drain grace): streams are aborted, TCP relays and
    /// the capture stop.
    pub(super) cancel: CancellationToken,
    /// Cancelled at the end: the capture listener closes (a child of `cancel`).
    pub(super) capture_cancel: CancellationToken,
    /// The capture table (source role, once installed): removed when dropped, and by the
    /// kernel when this process dies.
    pub(super) capture: Option<OwnedTable>,
    /// Target role: whether the migration's target address is this node's (virt-handler's
    /// addresses, or the advertised one), judged at its start; streams are admitted only then.
    pub(super) local_destination: bool,
}

/// Why no target migration admits a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoTarget {
    /// No target-role migration with that uid digest publishes that port.
    Unknown,
    /// There is one, but its target address is not this node's.
    NotLocal,
}

/// The handles a connection of a migration needs.
#[derive(Clone)]
pub struct Handles {
    pub migration: Migration,
    /// Cancelled when the migration's connections must stop: at an abort, or after the drain
    /// grace of a completed migration.
    pub cancel: CancellationToken,
    /// Closes the capture listener only.
    pub capture_cancel: CancellationToken,
}

impl Shared {
    pub fn new(
        rdma: RdmaState,
        peers: Arc<dyn PeerLookup>,
        locator: Arc<dyn NetnsLocator>,
        metrics: Metrics,
        settings: Settings,
    ) -> Shared {
        Shared {
            rdma,
            peers,
            locator,
            metrics,
            settings,
            keys: KeyRing::fixed(PeerKeys::default()),
            challenges: Mutex::new(Challenges::default()),
            migrations: Mutex::new(HashMap::new()),
            ended: Mutex::new(EndedMigrations::default()),
            tasks: TaskTracker::new(),
            stop: CancellationToken::new(),
        }
    }

    /// The same, with the peer keys of `keys`.
    pub fn with_keys(mut self, keys: KeyRing) -> Shared {
        self.keys = keys;
        self
    }

    /// The challenges issued as a target (short critical sections: the engine thread takes it).
    pub(crate) fn challenges(&self) -> std::sync::MutexGuard<'_, Challenges> {
        self.challenges
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Runs a connection (or capture listener) of a migration; see [`Shared::connections_closed`].
    pub(crate) fn spawn<F>(&self, future: F)
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        self.tasks.spawn(future);
    }

    /// [`Shared::spawn`] from outside the runtime (the stream engine's thread).
    pub(crate) fn spawn_on<F>(&self, future: F, runtime: &tokio::runtime::Handle)
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        self.tasks.spawn_on(future, runtime);
    }

    /// After the core stopped: waits up to `grace` for every connection task to end; whether
    /// they all did.
    pub async fn connections_closed(&self, grace: Duration) -> bool {
        self.tasks.close();
        tokio::time::timeout(grace, self.tasks.wait()).await.is_ok()
    }

    pub(super) fn table(&self) -> std::sync::MutexGuard<'_, HashMap<String, Active>> {
        // A poisoned map still holds consistent entries (no invariant spans an insert).
        self.migrations
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(super) fn ended(&self) -> std::sync::MutexGuard<'_, EndedMigrations> {
        self.ended
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The target-role migration whose uid has `digest` and that published `port`, with the
    /// destination a stream for it is dialed to (its target address and `port`), if that
    /// address is this node's.
    pub fn target_for(
        &self,
        digest: &UidDigest,
        port: u16,
    ) -> Result<(Handles, SocketAddr), NoTarget> {
        let table = self.table();
        let active = table
            .values()
            .find(|a| {
                a.digest == *digest
                    && a.migration.role == Role::Target
                    && a.migration.ports.contains(&port)
            })
            .ok_or(NoTarget::Unknown)?;
        if !active.local_destination {
            return Err(NoTarget::NotLocal);
        }
        let handles = Handles {
            migration: active.migration.clone(),
            cancel: active.cancel.clone(),
            capture_cancel: active.capture_cancel.clone(),
        };
        Ok((handles, SocketAddr::new(active.migration.target, port)))
    }

    /// [`Shared::target_for`] of `dst`'s port, if the destination is `dst`.
    #[cfg(test)]
    pub fn target_handles(&self, digest: &UidDigest, dst: SocketAddr) -> Option<Handles> {
        self.target_for(digest, dst.port())
            .ok()
            .filter(|(_, d)| *d == dst)
            .map(|(h, _)| h)
    }

    /// Number of migrations in progress.
    #[cfg(test)]
    pub fn active(&self) -> usize {
        self.table().len()
    }
}
