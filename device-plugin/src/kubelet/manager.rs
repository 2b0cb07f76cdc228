//! Reconciles the running pools with the config and the inventory.
//!
//! One runner per configured pool. Each pool's snapshot is rebuilt whenever the inventory or its
//! config changes and published to the runner's `watch` channel (only when it changed). A pool
//! removed from the config is drained; a new one is started; a bad config never reaches here
//! (the config watch keeps the last good one). In CDI mode a pool's spec is written only by
//! the process that holds the pool's instance lock ([`crate::kubelet::instance_lock`]).

use std::{
    collections::BTreeMap,
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use rdma_streams_common::{
    admin::{Gate, Readiness},
    report::Report,
    runtime::Tasks,
};
use tokio::{sync::watch, task::JoinHandle};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::{
    dir_watch::DirWatch,
    instance_lock,
    runner::{Runner, RunnerSettings},
};
use crate::{
    allocation::{cdi, pool::PoolSnapshot},
    config::{Config, PoolConfig},
    inventory::hca::Inventory,
    metrics::Metrics,
};

/// How long a pool may take to stop (its streams end, its socket goes).
const POOL_STOP_GRACE: Duration = Duration::from_secs(10);

/// A running pool.
struct RunningPool {
    tx: watch::Sender<Arc<PoolSnapshot>>,
    stop: CancellationToken,
    task: JoinHandle<()>,
    /// Set by the runner while it holds the pool's instance lock.
    holds_lock: Arc<AtomicBool>,
}

/// Everything the manager needs.
pub struct Manager {
    /// Shared by every runner; `settings.cdi_dir` is `--cdi-dir` when `--cdi` is on.
    pub settings: RunnerSettings,
    pub metrics: Metrics,
    /// Where each pool registers its gate.
    pub readiness: Readiness,
    /// Ready once there is a pool: `/ready` fails before the first one starts.
    pub pools_gate: Gate,
    /// Where removed pools are drained; its shutdown stops the manager.
    pub tasks: Tasks,
}

impl Manager {
    /// A manager whose pools register their gates in `readiness`, next to the gate `pools`.
    pub fn new(
        settings: RunnerSettings,
        metrics: Metrics,
        readiness: &Readiness,
        tasks: Tasks,
    ) -> Self {
        Self {
            settings,
            metrics,
            readiness: readiness.clone(),
            pools_gate: readiness.gate("pools"),
            tasks,
        }
    }

    /// Runs until `shutdown`, then drains every pool (streams end, sockets are removed).
    pub async fn run(
        self,
        mut config: watch::Receiver<Arc<Config>>,
        mut inventory: watch::Receiver<Arc<Inventory>>,
    ) {
        let dir_watch = DirWatch::new(&self.settings.socket_dir());
        let mut pools: BTreeMap<String, RunningPool> = BTreeMap::new();
        let mut first = true;
        loop {
            let cfg = config.borrow_and_update().clone();
            let inv = inventory.borrow_and_update().clone();
            if std::mem::take(&mut first) {
                // Before any runner of ours holds a lock: a lock held now is another
                // instance's.
                self.clean_stale_cdi(&cfg);
            }
            self.reconcile(&mut pools, &cfg, &inv, &dir_watch);
            self.pools_gate.set(!pools.is_empty());
            tokio::select! {
                () = self.tasks.shutdown().cancelled() => break,
                r = config.changed() => if r.is_err() { break },
                r = inventory.changed() => if r.is_err() { break },
            }
        }
        // CDI specs stay: kubelet replays checkpointed responses that name their devices.
        futures::future::join_all(pools.into_iter().map(|(name, pool)| async move {
            drain_pool(&name, pool).await;
        }))
        .await;
    }

    /// Start-up clean-up of specs a previous run left for pools that no longer exist (specs of
    /// current pools are kept and rewritten by their runners). Skipped while another instance
    /// on this node holds a pool: those specs may be its pools'.
    fn clean_stale_cdi(&self, cfg: &Config) {
        if let Some(dir) = &self.settings.cdi_dir {
            let locks = self.settings.socket_dir().join(instance_lock::LOCK_DIR);
            if instance_lock::any_held(&locks) {
                info!(dir = %dir.display(), "another rdma-device-plugin holds pools on this node; stale CDI specs left alone");
                return;
            }
            let keep: Vec<PathBuf> = cfg
                .pools
                .iter()
                .map(|p| cdi::spec_path(dir, &p.resource_name))
                .collect();
            let removed = cdi::clean_stale(dir, &keep);
            if removed > 0 {
                info!(removed, dir = %dir.display(), "removed stale CDI specs");
            }
        }
    }

    fn reconcile(
        &self,
        pools: &mut BTreeMap<String, RunningPool>,
        cfg: &Config,
        inv: &Inventory,
        dir_watch: &DirWatch,
    ) {
        let wanted: BTreeMap<&str, &PoolConfig> = cfg
            .pools
            .iter()
            .map(|p| (p.resource_name.as_str(), p))
            .collect();
        let gone: Vec<String> = pools
            .keys()
            .filter(|k| !wanted.contains_key(k.as_str()))
            .cloned()
            .collect();
        for name in gone {
            if let Some(pool) = pools.remove(&name) {
                info!(resource = %name, "pool removed from the config");
                let fut = self.stop_pool_owned(name.clone(), pool);
                self.tasks.spawn(format!("stop pool {name}"), fut);
            }
        }
        for (name, pool_cfg) in wanted {
            let snapshot = PoolSnapshot::build(pool_cfg, inv, cfg.resync);
            let (healthy, unhealthy) = snapshot.health_counts();
            self.metrics.set_devices(name, healthy, unhealthy);
            match pools.get_mut(name) {
                Some(running) => {
                    // The spec first, then the list kubelet allocates from; only the holder
                    // writes (a new pool's runner writes it once it holds the lock).
                    if let Some(dir) = &self.settings.cdi_dir
                        && running.holds_lock.load(Ordering::SeqCst)
                        && let Err(error) = cdi::write_spec(dir, &snapshot, &self.settings.dev_root)
                    {
                        warn!(resource = %name, error = %Report(&error), "cannot write the CDI spec");
                    }
                    running.tx.send_if_modified(|cur| {
                        if **cur == snapshot {
                            return false;
                        }
                        *cur = Arc::new(snapshot);
                        true
                    });
                }
                None => {
                    info!(resource = %name, healthy, unhealthy, "starting pool");
                    let (tx, rx) = watch::channel(Arc::new(snapshot));
                    let stop = self.tasks.shutdown().child_token();
                    let holds_lock = Arc::new(AtomicBool::new(false));
                    let runner = Runner {
                        resource_name: name.to_string(),
                        settings: self.settings.clone(),
                        snapshot: rx,
                        events: dir_watch.subscribe(),
                        metrics: self.metrics.clone(),
                        gate: self.readiness.gate(name),
                        shutdown: stop.clone(),
                        holds_lock: holds_lock.clone(),
                    };
                    let task = tokio::spawn(runner.run());
                    pools.insert(
                        name.to_string(),
                        RunningPool {
                            tx,
                            stop,
                            task,
                            holds_lock,
                        },
                    );
                }
            }
        }
    }

    fn stop_pool_owned(&self, name: String, pool: RunningPool) -> impl Future<Output = ()> + use<> {
        let cdi_dir = self.settings.cdi_dir.clone();
        let lock_path = self.settings.lock_path(&name);
        let metrics = self.metrics.clone();
        async move {
            drain_pool(&name, pool).await;
            // Our runner has let go of the lock; if another instance holds it now, the spec is
            // that instance's.
            if let Some(dir) = cdi_dir {
                match instance_lock::try_lock(&lock_path) {
                    Ok(None) => {
                        info!(resource = %name, "another instance serves the removed pool; its CDI spec stays")
                    }
                    Ok(Some(_)) | Err(_) => cdi::remove_spec(&dir, &name),
                }
            }
            metrics.forget_resource(&name);
        }
    }
}

async fn drain_pool(name: &str, pool: RunningPool) {
    pool.stop.cancel();
    let mut task = pool.task;
    if tokio::time::timeout(POOL_STOP_GRACE, &mut task)
        .await
        .is_err()
    {
        warn!(resource = %name, grace = ?POOL_STOP_GRACE, "pool did not stop in time; aborted");
        task.abort();
    }
}
