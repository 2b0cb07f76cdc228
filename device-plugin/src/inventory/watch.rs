//! Rediscovery: reads the sysfs and dev trees every interval, merges the verbs probe, and
//! publishes the inventory when it changed.
//!
//! sysfs attributes raise no inotify events, so port state is polled; one pass reads a few
//! small files per HCA. Health transitions are logged once each, with their reasons.

use std::{path::PathBuf, sync::Arc, time::Duration};

use rdma_streams_common::report::Report;
use rdma_streams_common::runtime::Tasks;
use tokio::sync::watch;
use tracing::{debug, info, warn};

use super::{
    discovery,
    hca::{Hca, Inventory},
    netns_mode::{self, NetnsMode},
};
use crate::metrics::{HcaHealthLabels, Metrics};

/// Where and how often to look.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InventorySettings {
    pub sys_root: PathBuf,
    pub dev_root: PathBuf,
    pub interval: Duration,
    /// Merge the libibverbs port query into health (when built with the `verbs` feature).
    pub verbs: bool,
}

/// One discovery pass, verbs probe included. Errors keep the caller's last inventory.
pub fn discover_once(settings: &InventorySettings) -> Result<Inventory, discovery::DiscoveryError> {
    let mut inv = discovery::discover(&settings.sys_root, &settings.dev_root)?;
    if settings.verbs {
        super::verbs::merge_probe(&mut inv);
    }
    Ok(inv)
}

/// Logs what changed between two inventories.
pub fn log_transitions(old: &Inventory, new: &Inventory) {
    for hca in &new.hcas {
        match old.hca(&hca.name) {
            None => info!(
                hca = %hca.name,
                numa = ?hca.numa_node,
                link_layers = ?hca.link_layers(),
                healthy = hca.health.is_healthy(),
                reasons = ?hca.health.reasons,
                "RDMA device appeared"
            ),
            Some(prev) => log_health_change(prev, hca),
        }
    }
    for hca in &old.hcas {
        if new.hca(&hca.name).is_none() {
            warn!(hca = %hca.name, "RDMA device removed");
        }
    }
    if old.rdma_cm.present != new.rdma_cm.present {
        info!(present = new.rdma_cm.present, "rdma_cm device changed");
    }
    if old.netns_mode != new.netns_mode {
        match netns_mode::advice(new.netns_mode) {
            Some(advice) => warn!(mode = new.netns_mode.as_str(), "{advice}"),
            None if old.netns_mode == NetnsMode::Unknown => {
                debug!(mode = new.netns_mode.as_str(), "RDMA netns mode")
            }
            None => info!(mode = new.netns_mode.as_str(), "RDMA netns mode changed"),
        }
    }
}

fn log_health_change(prev: &Hca, hca: &Hca) {
    match (prev.health.is_healthy(), hca.health.is_healthy()) {
        (true, false) => {
            warn!(hca = %hca.name, reasons = ?hca.health.reasons, "RDMA device unhealthy")
        }
        (false, true) => info!(hca = %hca.name, "RDMA device healthy again"),
        (false, false) if prev.health != hca.health => {
            warn!(hca = %hca.name, reasons = ?hca.health.reasons, "RDMA device still unhealthy");
        }
        _ => {}
    }
}

fn record(metrics: &Metrics, inv: &Inventory) {
    metrics
        .netns_exclusive
        .set(i64::from(inv.netns_mode == NetnsMode::Exclusive));
    let healthy = inv.hcas.iter().filter(|h| h.health.is_healthy()).count();
    for (health, n) in [
        ("Healthy", healthy),
        ("Unhealthy", inv.hcas.len() - healthy),
    ] {
        metrics
            .hcas
            .get_or_create(&HcaHealthLabels {
                health: health.to_string(),
            })
            .set(i64::try_from(n).unwrap_or(i64::MAX));
    }
}

/// Runs the first pass, then the loop as the task `inventory` of `tasks` (until their
/// shutdown); the receiver holds the first pass's inventory (empty if it failed).
pub async fn spawn(
    settings: InventorySettings,
    metrics: Metrics,
    tasks: &Tasks,
) -> watch::Receiver<Arc<Inventory>> {
    let first = run_pass(&settings).await.unwrap_or_default();
    log_transitions(&Inventory::default(), &first);
    if first.hcas.is_empty() {
        info!(sys_root = %settings.sys_root.display(), "no RDMA device yet; watching for one");
    }
    record(&metrics, &first);
    let (tx, rx) = watch::channel(Arc::new(first));
    let shutdown = tasks.shutdown().clone();
    tasks.spawn("inventory", async move {
        loop {
            tokio::select! {
                () = shutdown.cancelled() => break,
                () = tokio::time::sleep(settings.interval) => {}
            }
            let Some(inv) = run_pass(&settings).await else {
                continue;
            };
            record(&metrics, &inv);
            tx.send_if_modified(|cur| {
                if **cur == inv {
                    return false;
                }
                log_transitions(cur, &inv);
                *cur = Arc::new(inv);
                true
            });
        }
    });
    rx
}

async fn run_pass(settings: &InventorySettings) -> Option<Inventory> {
    let s = settings.clone();
    match tokio::task::spawn_blocking(move || discover_once(&s)).await {
        Ok(Ok(inv)) => Some(inv),
        Ok(Err(error)) => {
            warn!(error = %Report(&error), "discovery failed; keeping the last inventory");
            None
        }
        Err(error) => {
            warn!(error = %Report(&error), "discovery task failed; keeping the last inventory");
            None
        }
    }
}
