//! A pool's view of the inventory: the slots it advertises to kubelet.
//!
//! Every matched HCA contributes `slotsPerHca` slots with IDs `<rdmadev>-<nnnn>`, each carrying
//! its HCA's NUMA node and health. The snapshot is rebuilt whenever the inventory or the pool's
//! config changes and handed to the gRPC service through a `watch` channel, so every
//! ListAndWatch stream reads the same current state.

use std::{collections::BTreeMap, time::Duration};

use serde::Serialize;

use crate::{
    api::v1beta1 as pb,
    config::{MountConfig, PoolConfig},
    inventory::hca::{CharDev, Hca, Inventory},
};

/// Kubelet rejects device IDs longer than this.
pub const MAX_DEVICE_ID_LEN: usize = 63;

/// One schedulable unit of a pool.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Slot {
    pub id: String,
    /// The RDMA device the slot belongs to.
    pub hca: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub numa_node: Option<i64>,
    pub healthy: bool,
}

/// What a pool advertises and allocates at one moment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolSnapshot {
    pub resource_name: String,
    /// Slots in ID order.
    pub slots: Vec<Slot>,
    /// The matched HCAs by name.
    pub hcas: BTreeMap<String, Hca>,
    pub rdma_cm: CharDev,
    pub mounts: Vec<MountConfig>,
    /// Full-list re-send period of ListAndWatch (the config's `resyncSeconds`).
    pub resync: Duration,
}

/// `mlx5_0`, 3 -> `mlx5_0-0003`. Over-long RDMA device names are cut from the front so the
/// ID stays unique per slot and within kubelet's 63 characters.
pub fn slot_id(hca: &str, slot: u32) -> String {
    let suffix = format!("-{slot:04}");
    let room = MAX_DEVICE_ID_LEN.saturating_sub(suffix.len());
    let name = if hca.len() > room {
        &hca[hca.len() - room..]
    } else {
        hca
    };
    format!("{name}{suffix}")
}

impl PoolSnapshot {
    /// The pool's slots over the HCAs of `inventory` its selectors match.
    pub fn build(pool: &PoolConfig, inventory: &Inventory, resync: Duration) -> Self {
        let mut hcas = BTreeMap::new();
        let mut slots = Vec::new();
        for hca in inventory.hcas.iter().filter(|h| pool.selectors.matches(h)) {
            let healthy = hca.health.is_healthy() && inventory.rdma_cm.present;
            for n in 0..pool.slots_per_hca {
                slots.push(Slot {
                    id: slot_id(&hca.name, n),
                    hca: hca.name.clone(),
                    numa_node: hca.numa_node,
                    healthy,
                });
            }
            hcas.insert(hca.name.clone(), hca.clone());
        }
        slots.sort_by(|a, b| a.id.cmp(&b.id));
        Self {
            resource_name: pool.resource_name.clone(),
            slots,
            hcas,
            rdma_cm: inventory.rdma_cm.clone(),
            mounts: pool.mounts.clone(),
            resync,
        }
    }

    pub fn slot(&self, id: &str) -> Option<&Slot> {
        self.slots
            .binary_search_by(|s| s.id.as_str().cmp(id))
            .ok()
            .map(|i| &self.slots[i])
    }

    /// The full device list for ListAndWatch.
    pub fn kubelet_devices(&self) -> Vec<pb::Device> {
        self.slots
            .iter()
            .map(|s| pb::Device {
                id: s.id.clone(),
                health: if s.healthy {
                    crate::api::HEALTHY
                } else {
                    crate::api::UNHEALTHY
                }
                .to_string(),
                topology: s.numa_node.map(|n| pb::TopologyInfo {
                    nodes: vec![pb::NumaNode { id: n }],
                }),
            })
            .collect()
    }

    /// (healthy, unhealthy) slot counts.
    pub fn health_counts(&self) -> (usize, usize) {
        let healthy = self.slots.iter().filter(|s| s.healthy).count();
        (healthy, self.slots.len() - healthy)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_padded_and_bounded() {
        assert_eq!(slot_id("mlx5_0", 3), "mlx5_0-0003");
        assert_eq!(slot_id("mlx5_0", 12345), "mlx5_0-12345");
        let long = "x".repeat(80);
        let id = slot_id(&long, 1);
        assert_eq!(id.len(), MAX_DEVICE_ID_LEN);
        assert!(id.ends_with("-0001"));
    }
}
