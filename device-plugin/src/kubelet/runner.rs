//! The lifecycle of one pool's gRPC server: take the pool's instance lock, serve on a fresh
//! socket, then register, then watch for anything that means kubelet lost us, and start over.
//!
//! ```text
//!   instance lock (standby while another instance holds it; crate::kubelet::instance_lock)
//!     |
//!   bind fresh socket -> serve -> Register (retry with backoff) -> registered
//!        ^                                                            |
//!        +---- kubelet.sock created again / own socket gone ----------+
//!        +---- NotifyRegistrationStatus(false) / server died (after backoff)
//!   lock file replaced -> re-take it, or stand by if another instance took it first
//! ```
//!
//! Nothing here ends the process: a failed bind, Register or watcher notification is logged,
//! counted and retried until the plugin drains.

use std::{
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use rdma_streams_common::{admin::Gate, backoff::Backoff, report::Report};
use tokio::{
    sync::{broadcast, mpsc, watch},
    time::Instant,
};
use tokio_util::sync::CancellationToken;
use tonic::transport::Server;
use tracing::{Instrument, error, info, info_span, warn};

use super::{
    dir_watch::DirEvent,
    instance_lock::{self, InstanceLock},
    registration::{self, RegistrationMode, WatcherRegistration, WatcherStatus},
    resource_name::socket_file_name,
    service::PoolService,
};
use crate::{
    allocation::{allocate::DeviceHandoff, cdi, pool::PoolSnapshot},
    api::{
        KUBELET_SOCKET, pluginregistration::registration_server::RegistrationServer,
        v1beta1::device_plugin_server::DevicePluginServer,
    },
    metrics::Metrics,
    uds,
};

/// The kubelet folders below `--kubelet-root-dir`.
pub const DEVICE_PLUGINS_DIR: &str = "device-plugins";
pub const PLUGINS_REGISTRY_DIR: &str = "plugins_registry";

/// How often a standby pool tries the instance lock (two syscalls a try): the takeover after
/// the holder exits takes at most this long plus a Register.
pub const STANDBY_POLL: Duration = Duration::from_millis(100);

/// Settings shared by every pool's runner.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunnerSettings {
    pub kubelet_root: PathBuf,
    pub mode: RegistrationMode,
    pub dev_root: PathBuf,
    /// How often the runner checks its own socket and kubelet's.
    pub poll: Duration,
    /// `--cdi-dir` when `--cdi` is on: allocations name CDI devices, and the pool's holder
    /// keeps the pool's spec there.
    pub cdi_dir: Option<PathBuf>,
}

impl RunnerSettings {
    /// The folder our sockets live in for this mode.
    pub fn socket_dir(&self) -> PathBuf {
        match self.mode {
            RegistrationMode::KubeletSock => self.kubelet_root.join(DEVICE_PLUGINS_DIR),
            RegistrationMode::PluginWatcher => self.kubelet_root.join(PLUGINS_REGISTRY_DIR),
        }
    }

    /// The instance lock of the pool `resource` ([`crate::kubelet::instance_lock`]).
    pub fn lock_path(&self, resource: &str) -> PathBuf {
        instance_lock::lock_path(&self.socket_dir(), &socket_file_name(resource))
    }

    pub fn kubelet_socket(&self) -> PathBuf {
        self.kubelet_root
            .join(DEVICE_PLUGINS_DIR)
            .join(KUBELET_SOCKET)
    }
}

/// Where one pool stands. Ready (for `/ready`) when registered, or when standing by because
/// another instance on the node serves it ([`crate::kubelet::instance_lock`]; ready, so that a
/// DaemonSet rollout with `maxSurge` can go on and end the old instance).
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

/// Why a server instance ended.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    Shutdown,
    /// kubelet lost us: start over at once.
    Restart(&'static str),
    /// Something failed: start over after a backoff delay.
    Failed(String),
    /// Our lock file was deleted or replaced: take the lock again before serving on.
    LockLost,
}

/// Runs one pool until `shutdown` is cancelled.
pub struct Runner {
    pub resource_name: String,
    pub settings: RunnerSettings,
    pub snapshot: watch::Receiver<Arc<PoolSnapshot>>,
    pub events: broadcast::Receiver<DirEvent>,
    pub metrics: Metrics,
    /// The pool's readiness gate, named after its resource: ready while registered or standing
    /// by ([`PoolState`]).
    pub gate: Gate,
    pub shutdown: CancellationToken,
    /// True while this runner holds the pool's instance lock (or runs without one): only then
    /// may this process write the pool's CDI spec.
    pub holds_lock: Arc<AtomicBool>,
}

impl Runner {
    pub async fn run(mut self) {
        let span = info_span!("pool", resource = %self.resource_name);
        async move {
            let mut backoff = registration::retry_backoff();
            self.set_state(PoolState::NotRegistered);
            let lock_path = self.settings.lock_path(&self.resource_name);
            'locked: loop {
                let Some(lock) = self.lock(&lock_path).await else {
                    break;
                };
                self.holds_lock.store(true, Ordering::SeqCst);
                self.write_cdi_spec();
                loop {
                    let outcome = self.serve_once(&mut backoff, lock.as_ref()).await;
                    self.set_state(PoolState::NotRegistered);
                    match outcome {
                        Outcome::Shutdown => break 'locked,
                        Outcome::LockLost => {
                            warn!(lock = %lock_path.display(), "the instance lock file was replaced; taking the lock again");
                            self.holds_lock.store(false, Ordering::SeqCst);
                            continue 'locked;
                        }
                        Outcome::Restart(reason) => {
                            info!(reason, "serving on a fresh socket and registering again");
                            self.metrics
                                .kubelet_restarts
                                .get_or_create(&Metrics::resource(&self.resource_name))
                                .inc();
                        }
                        Outcome::Failed(error) => {
                            let delay = backoff.next_delay();
                            error!(%error, retry_in = ?delay, "device plugin server failed");
                            tokio::select! {
                                () = self.shutdown.cancelled() => break 'locked,
                                () = tokio::time::sleep(delay) => {}
                            }
                        }
                    }
                }
            }
            self.holds_lock.store(false, Ordering::SeqCst);
            let labels = Metrics::resource(&self.resource_name);
            self.metrics.registered.remove(&labels);
            self.metrics.standby.remove(&labels);
            self.gate.remove();
            info!("pool stopped");
        }
        .instrument(span)
        .await;
    }

    /// Takes the pool's instance lock, standing by while another instance holds it. `None` on
    /// shutdown; `Some(None)` when no lock can be had at all (unwritable folder): serving
    /// without one beats not serving.
    async fn lock(&mut self, path: &Path) -> Option<Option<InstanceLock>> {
        let mut said = false;
        loop {
            match instance_lock::try_lock(path) {
                Ok(Some(lock)) => {
                    if said {
                        info!(lock = %path.display(), "the other instance is gone; taking over");
                        self.set_state(PoolState::NotRegistered);
                    }
                    return Some(Some(lock));
                }
                Ok(None) => {
                    if !said {
                        warn!(lock = %path.display(), "another rdma-device-plugin on this node serves this pool; standing by until it exits");
                        said = true;
                    }
                    self.set_state(PoolState::Standby);
                }
                Err(error) => {
                    warn!(error = %Report(&error), lock = %path.display(), "cannot take the instance lock; serving without it");
                    self.set_state(PoolState::NotRegistered);
                    return Some(None);
                }
            }
            tokio::select! {
                () = self.shutdown.cancelled() => return None,
                () = tokio::time::sleep(self.settings.poll.min(STANDBY_POLL)) => {}
            }
        }
    }

    async fn serve_once(&mut self, backoff: &mut Backoff, lock: Option<&InstanceLock>) -> Outcome {
        let dir = self.settings.socket_dir();
        let sock_name = socket_file_name(&self.resource_name);
        let sock_path = dir.join(&sock_name);
        let listener = match uds::bind_fresh(&sock_path) {
            Ok(l) => l,
            Err(e) => {
                return Outcome::Failed(format!("binding {}: {}", sock_path.display(), Report(&e)));
            }
        };
        let my_id = uds::file_id(&sock_path);
        let stop = self.shutdown.child_token();
        let (status_tx, mut status_rx) = mpsc::unbounded_channel();
        let service = PoolService {
            snapshot: self.snapshot.clone(),
            dev_root: self.settings.dev_root.clone(),
            handoff: if self.settings.cdi_dir.is_some() {
                DeviceHandoff::Cdi {
                    kind: cdi::cdi_kind(&self.resource_name),
                }
            } else {
                DeviceHandoff::DeviceSpecs
            },
            metrics: self.metrics.clone(),
            stop: stop.clone(),
        };
        let watcher_mode = self.settings.mode == RegistrationMode::PluginWatcher;
        let router = Server::builder().add_service(DevicePluginServer::new(service));
        let router = router.add_optional_service(watcher_mode.then(|| {
            RegistrationServer::new(WatcherRegistration {
                resource_name: self.resource_name.clone(),
                // Empty: kubelet then dials the very socket it discovered, by its host path,
                // so the plugin's mount path need not match the host's.
                endpoint: String::new(),
                status: status_tx,
            })
        }));
        let server_stop = stop.clone();
        let mut server = tokio::spawn(router.serve_with_incoming_shutdown(
            uds::incoming(listener),
            async move {
                server_stop.cancelled().await;
            },
        ));
        info!(socket = %sock_path.display(), mode = ?self.settings.mode, "serving");

        let kubelet_sock = self.settings.kubelet_socket();
        let mut registered = false;
        let mut failures = 0u32;
        let mut kubelet_id = None;
        let mut retry_at = (!watcher_mode).then(Instant::now);
        let mut poll = tokio::time::interval(self.settings.poll);
        poll.reset();

        let outcome = loop {
            tokio::select! {
                biased;
                () = self.shutdown.cancelled() => break Outcome::Shutdown,
                res = &mut server => {
                    let why = match res {
                        Ok(Ok(())) => "server stopped".to_string(),
                        Ok(Err(e)) => format!("server error: {}", Report(&e)),
                        Err(e) => format!("server task: {}", Report(&e)),
                    };
                    break Outcome::Failed(why);
                }
                ev = self.events.recv() => {
                    let ev = match ev {
                        Ok(ev) => Some(ev),
                        Err(broadcast::error::RecvError::Lagged(_)) => None,
                        Err(broadcast::error::RecvError::Closed) => continue,
                    };
                    let kubelet_new = match &ev {
                        Some(DirEvent::Created(n)) => n == KUBELET_SOCKET,
                        None => true,
                        _ => false,
                    };
                    if uds::file_id(&sock_path) != my_id {
                        break Outcome::Restart("own socket removed");
                    }
                    if !watcher_mode && kubelet_new {
                        if !registered {
                            retry_at = Some(Instant::now());
                        } else if uds::file_id(&kubelet_sock) != kubelet_id {
                            break Outcome::Restart("kubelet.sock created again");
                        }
                    }
                }
                () = sleep_until(retry_at) => {
                    let attempt = tokio::select! {
                        () = self.shutdown.cancelled() => break Outcome::Shutdown,
                        r = registration::register(&kubelet_sock, &self.resource_name, &sock_name) => r,
                    };
                    match attempt {
                        Ok(()) => {
                            registered = true;
                            kubelet_id = uds::file_id(&kubelet_sock);
                            retry_at = None;
                            backoff.reset();
                            self.on_registered();
                        }
                        Err(error) => {
                            let delay = backoff.next_delay();
                            self.count_registration("error");
                            failures += 1;
                            // Right after a kubelet restart its socket may not be there yet:
                            // say so quietly; keep failing and it becomes a warning.
                            if failures < 3 {
                                info!(error = %Report(&error), retry_in = ?delay, "Register failed; retrying");
                            } else {
                                warn!(error = %Report(&error), failures, retry_in = ?delay, "Register keeps failing");
                            }
                            retry_at = Some(Instant::now() + delay);
                        }
                    }
                }
                Some(status) = status_rx.recv() => match status {
                    WatcherStatus::Registered => {
                        registered = true;
                        backoff.reset();
                        self.on_registered();
                    }
                    WatcherStatus::Failed(error) => {
                        self.count_registration("error");
                        break Outcome::Failed(format!("plugin watcher registration failed: {error}"));
                    }
                },
                _ = poll.tick() => {
                    if lock.is_some_and(|l| !l.still_held()) {
                        break Outcome::LockLost;
                    }
                    if uds::file_id(&sock_path) != my_id {
                        break Outcome::Restart("own socket removed");
                    }
                    if registered && !watcher_mode && uds::file_id(&kubelet_sock) != kubelet_id {
                        break Outcome::Restart("kubelet.sock replaced");
                    }
                }
            }
        };

        stop.cancel();
        if tokio::time::timeout(Duration::from_secs(5), &mut server)
            .await
            .is_err()
        {
            warn!("server did not stop within 5s; aborting it");
            server.abort();
        }
        if outcome == Outcome::Shutdown {
            uds::remove_if_ours(&sock_path, my_id);
        }
        outcome
    }

    fn count_registration(&self, result: &str) {
        self.metrics
            .registrations
            .get_or_create(&Metrics::result(&self.resource_name, result))
            .inc();
    }

    /// Writes the pool's CDI spec from the current snapshot (CDI mode only), now that this
    /// process holds the pool: a standby instance never touches the holder's spec.
    fn write_cdi_spec(&self) {
        if let Some(dir) = &self.settings.cdi_dir {
            let snapshot = self.snapshot.borrow().clone();
            if let Err(error) = cdi::write_spec(dir, &snapshot, &self.settings.dev_root) {
                warn!(error = %Report(&error), "cannot write the CDI spec");
            }
        }
    }

    /// Where the pool stands, for `/ready` and the `registered` and `standby` gauges at once.
    fn set_state(&self, state: PoolState) {
        self.gate
            .set_with_note(state != PoolState::NotRegistered, state.as_str());
        let labels = Metrics::resource(&self.resource_name);
        let flag = |wanted: PoolState| i64::from(state == wanted);
        self.metrics
            .registered
            .get_or_create(&labels)
            .set(flag(PoolState::Registered));
        self.metrics
            .standby
            .get_or_create(&labels)
            .set(flag(PoolState::Standby));
    }

    fn on_registered(&self) {
        self.count_registration("ok");
        self.set_state(PoolState::Registered);
        info!("registered with kubelet");
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
