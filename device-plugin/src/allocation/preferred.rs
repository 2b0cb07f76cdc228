//! GetPreferredAllocation: pack a request onto one HCA and one NUMA node.
//!
//! kubelet offers the healthy free IDs, the IDs it must include, and a size. We answer with the
//! must-include IDs, then fill from the HCA that already holds must-include IDs, then from HCAs on
//! the same NUMA node, best fit first (the HCA with the fewest free slots that still holds the
//! whole remainder, so big free HCAs stay free for big requests), then from anywhere else.

use std::collections::{BTreeMap, BTreeSet};

use super::pool::PoolSnapshot;

/// The preferred set of `size` IDs (fewer when not enough IDs are available).
pub fn preferred_allocation(
    snapshot: &PoolSnapshot,
    available: &[String],
    must_include: &[String],
    size: usize,
) -> Vec<String> {
    let mut chosen: Vec<String> = Vec::with_capacity(size);
    let mut taken: BTreeSet<&str> = BTreeSet::new();
    for id in must_include {
        if taken.insert(id.as_str()) {
            chosen.push(id.clone());
        }
    }
    if chosen.len() >= size {
        return chosen;
    }

    // Free candidates grouped by HCA; IDs we do not know are ignored (kubelet never offers
    // them, and if it did we could not place them).
    let mut groups: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for id in available {
        if taken.contains(id.as_str()) {
            continue;
        }
        if let Some(slot) = snapshot.slot(id) {
            groups
                .entry(slot.hca.as_str())
                .or_default()
                .push(id.as_str());
        }
    }
    for ids in groups.values_mut() {
        ids.sort_unstable();
        ids.dedup();
    }

    let numa_of = |hca: &str| snapshot.hcas.get(hca).and_then(|h| h.numa_node);
    let must_hcas: BTreeSet<&str> = must_include
        .iter()
        .filter_map(|id| snapshot.slot(id).map(|s| s.hca.as_str()))
        .collect();
    let remaining = size - chosen.len();

    let mut order: Vec<&str> = groups.keys().copied().collect();
    // Best fit first: HCAs that hold the whole remainder, the fullest of them first.
    let fit_key = |hca: &&str| {
        let free = groups[hca].len();
        (
            !must_hcas.contains(hca),
            free < remaining,
            free,
            hca.to_string(),
        )
    };
    order.sort_by_key(fit_key);
    let target_numa = must_hcas
        .iter()
        .find_map(|h| numa_of(h))
        .or_else(|| order.first().and_then(|h| numa_of(h)));
    order.sort_by_key(|hca| {
        let (in_must, short, free, name) = fit_key(hca);
        let off_numa = target_numa.is_some() && numa_of(hca) != target_numa;
        (in_must, off_numa, short, free, name)
    });

    for hca in order {
        for id in &groups[hca] {
            if chosen.len() == size {
                return chosen;
            }
            chosen.push((*id).to_string());
        }
    }
    chosen
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        config::PoolConfig,
        inventory::hca::{Hca, Inventory},
    };
    use rdma_device_plugin_testkit::fixture::{FixtureTree, HcaSpec};

    fn snapshot(specs: Vec<HcaSpec>, slots: u32) -> PoolSnapshot {
        let dir = tempfile::tempdir().unwrap();
        let tree = FixtureTree::new(dir.path()).unwrap();
        for s in specs {
            tree.add_hca(s).unwrap();
        }
        let inv: Inventory =
            crate::inventory::discovery::discover(&tree.sys_root(), &tree.dev_root()).unwrap();
        let pool = PoolConfig {
            slots_per_hca: slots,
            ..crate::config::Config::default().pools[0].clone()
        };
        PoolSnapshot::build(&pool, &inv, crate::config::DEFAULT_RESYNC)
    }

    fn ids(snap: &PoolSnapshot, hca: &str) -> Vec<String> {
        snap.slots
            .iter()
            .filter(|s| s.hca == hca)
            .map(|s| s.id.clone())
            .collect()
    }

    fn hca_of<'a>(snap: &'a PoolSnapshot, id: &str) -> &'a Hca {
        &snap.hcas[&snap.slot(id).unwrap().hca]
    }

    #[test]
    fn packs_onto_one_hca_best_fit() {
        let snap = snapshot(
            vec![
                HcaSpec::connectx_ib("mlx5_0", "0000:3b:00.0").numa(0),
                HcaSpec::connectx_ib("mlx5_1", "0000:5e:00.0").numa(0),
            ],
            4,
        );
        // mlx5_0 has 2 free, mlx5_1 has 4 free: a request of 2 goes to the fuller mlx5_0.
        let mut available = ids(&snap, "mlx5_0")[2..].to_vec();
        available.extend(ids(&snap, "mlx5_1"));
        let got = preferred_allocation(&snap, &available, &[], 2);
        assert_eq!(got, ids(&snap, "mlx5_0")[2..].to_vec());
        // A request of 3 does not fit mlx5_0: it goes whole to mlx5_1.
        let got = preferred_allocation(&snap, &available, &[], 3);
        assert!(got.iter().all(|id| hca_of(&snap, id).name == "mlx5_1"));
        assert_eq!(got.len(), 3);
    }

    #[test]
    fn must_include_wins_and_numa_follows_it() {
        let snap = snapshot(
            vec![
                HcaSpec::connectx_ib("mlx5_0", "0000:3b:00.0").numa(0),
                HcaSpec::connectx_ib("mlx5_1", "0000:5e:00.0").numa(1),
                HcaSpec::connectx_ib("mlx5_2", "0000:af:00.0").numa(1),
            ],
            2,
        );
        let all: Vec<String> = snap.slots.iter().map(|s| s.id.clone()).collect();
        let must = vec![ids(&snap, "mlx5_1")[0].clone()];
        let got = preferred_allocation(&snap, &all, &must, 4);
        assert_eq!(got[0], must[0]);
        assert_eq!(got.len(), 4);
        // mlx5_1's other slot, then mlx5_2 (same NUMA node 1), never mlx5_0 (node 0).
        assert_eq!(hca_of(&snap, &got[1]).name, "mlx5_1");
        assert!(got.iter().all(|id| hca_of(&snap, id).numa_node == Some(1)));
    }

    #[test]
    fn short_supply_and_unknown_ids() {
        let snap = snapshot(vec![HcaSpec::connectx_ib("mlx5_0", "0000:3b:00.0")], 2);
        let mut available = ids(&snap, "mlx5_0");
        available.push("ghost-0001".into());
        let got = preferred_allocation(&snap, &available, &[], 5);
        assert_eq!(got, ids(&snap, "mlx5_0"));
        assert!(preferred_allocation(&snap, &available, &[], 0).is_empty());
    }
}
