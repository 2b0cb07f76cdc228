//! Allocate: the char devices, env and mounts of exactly the HCAs behind the requested IDs.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
};

use super::pool::PoolSnapshot;
use crate::{
    api::v1beta1 as pb,
    inventory::hca::{CharDev, CharDevKind, Hca},
};

/// Env var naming the allocated RDMA devices, comma separated (`mlx5_0,mlx5_1`).
pub const DEVICES_ENV: &str = "RDMA_STREAMS_DEVICES";
/// Where char devices appear in the container.
pub const CONTAINER_DEV_DIR: &str = "/dev/infiniband";

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AllocateError {
    #[error("unknown device ID {id:?} for resource {resource}")]
    UnknownDevice { resource: String, id: String },
    #[error("empty device list for resource {resource}")]
    Empty { resource: String },
    #[error("device {id} of {resource}: char device {path} is missing on the node")]
    CharDeviceMissing {
        resource: String,
        id: String,
        path: String,
    },
}

/// How an Allocate response hands the devices to the container runtime: as device nodes and
/// mounts, or as CDI device names the runtime resolves from the spec on disk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeviceHandoff {
    /// `DeviceSpec`s and `Mount`s in the response.
    DeviceSpecs,
    /// `cdi_devices` naming the devices of a CDI spec of this kind (`vendor/class`).
    Cdi { kind: String },
}

/// The HCAs behind `ids`, sorted by name, or an error naming the first bad ID.
pub fn hcas_for<'a>(
    snapshot: &'a PoolSnapshot,
    ids: &[String],
) -> Result<Vec<&'a Hca>, AllocateError> {
    if ids.is_empty() {
        return Err(AllocateError::Empty {
            resource: snapshot.resource_name.clone(),
        });
    }
    let mut names = BTreeSet::new();
    for id in ids {
        let slot = snapshot
            .slot(id)
            .ok_or_else(|| AllocateError::UnknownDevice {
                resource: snapshot.resource_name.clone(),
                id: id.clone(),
            })?;
        names.insert(slot.hca.as_str());
    }
    Ok(names
        .into_iter()
        .filter_map(|n| snapshot.hcas.get(n))
        .collect())
}

/// The char devices a container needs for these HCAs: `rdma_cm` once, then each HCA's uverbs,
/// umads and (InfiniBand ports only) issms.
pub fn char_devices<'a>(snapshot: &'a PoolSnapshot, hcas: &[&'a Hca]) -> Vec<&'a CharDev> {
    let mut out = vec![&snapshot.rdma_cm];
    for hca in hcas {
        out.extend(hca_char_devices(hca));
    }
    out
}

/// One HCA's own char devices (no `rdma_cm`).
pub fn hca_char_devices(hca: &Hca) -> impl Iterator<Item = &CharDev> {
    let ib = hca.has_infiniband_port();
    hca.char_devices
        .iter()
        .filter(move |c| c.kind != CharDevKind::Issm || ib)
}

/// A `DeviceSpec` for a char device under `dev_root`.
pub fn device_spec(dev_root: &Path, dev: &CharDev) -> pb::DeviceSpec {
    pb::DeviceSpec {
        container_path: format!("{CONTAINER_DEV_DIR}/{}", dev.name),
        host_path: dev_root.join(dev.rel_path()).to_string_lossy().into_owned(),
        permissions: "rw".to_string(),
    }
}

/// The response for one container request.
pub fn allocate(
    snapshot: &PoolSnapshot,
    ids: &[String],
    dev_root: &Path,
    handoff: &DeviceHandoff,
) -> Result<pb::ContainerAllocateResponse, AllocateError> {
    let hcas = hcas_for(snapshot, ids)?;
    let devs = char_devices(snapshot, &hcas);
    if let Some(missing) = devs.iter().find(|d| !d.present) {
        // The requested ID whose HCA owns the missing node (rdma_cm is everyone's).
        let id = ids
            .iter()
            .find(|id| {
                snapshot.slot(id).is_some_and(|s| {
                    snapshot
                        .hcas
                        .get(&s.hca)
                        .is_some_and(|h| h.char_devices.iter().any(|c| c.name == missing.name))
                })
            })
            .unwrap_or(&ids[0]);
        return Err(AllocateError::CharDeviceMissing {
            resource: snapshot.resource_name.clone(),
            id: id.clone(),
            path: dev_root
                .join(missing.rel_path())
                .to_string_lossy()
                .into_owned(),
        });
    }
    let names: Vec<&str> = hcas.iter().map(|h| h.name.as_str()).collect();
    let envs = BTreeMap::from([(DEVICES_ENV.to_string(), names.join(","))]);
    let mut resp = pb::ContainerAllocateResponse {
        envs: envs.into_iter().collect(),
        ..Default::default()
    };
    match handoff {
        DeviceHandoff::DeviceSpecs => {
            resp.devices = devs.iter().map(|d| device_spec(dev_root, d)).collect();
            resp.mounts = snapshot
                .mounts
                .iter()
                .map(|m| pb::Mount {
                    container_path: m.container_path.to_string_lossy().into_owned(),
                    host_path: m.host_path.to_string_lossy().into_owned(),
                    read_only: true,
                })
                .collect();
        }
        DeviceHandoff::Cdi { kind } => {
            resp.cdi_devices = names
                .iter()
                .map(|n| pb::CdiDevice {
                    name: format!("{kind}={n}"),
                })
                .collect();
        }
    }
    Ok(resp)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Config, MountConfig, PoolConfig};
    use rdma_device_plugin_testkit::fixture::{FixtureTree, HcaSpec};

    fn setup(dir: &Path) -> (FixtureTree, PoolSnapshot) {
        let tree = FixtureTree::new(dir).unwrap();
        tree.add_hca(HcaSpec::connectx_ib("mlx5_0", "0000:3b:00.0").numa(0))
            .unwrap();
        tree.add_hca(
            HcaSpec::connectx_eth("mlx5_1", "0000:5e:00.0")
                .numa(1)
                .netdev("ens2f0np0"),
        )
        .unwrap();
        let inv =
            crate::inventory::discovery::discover(&tree.sys_root(), &tree.dev_root()).unwrap();
        let pool = PoolConfig {
            slots_per_hca: 2,
            mounts: vec![MountConfig {
                host_path: "/opt/rdma-streams/shim/0.1.0".into(),
                container_path: "/opt/rdma-streams/shim".into(),
            }],
            ..Config::default().pools[0].clone()
        };
        let snap = PoolSnapshot::build(&pool, &inv, crate::config::DEFAULT_RESYNC);
        (tree, snap)
    }

    fn paths(resp: &pb::ContainerAllocateResponse) -> Vec<String> {
        resp.devices
            .iter()
            .map(|d| d.container_path.clone())
            .collect()
    }

    #[test]
    fn only_the_allocated_hca() {
        let dir = tempfile::tempdir().unwrap();
        let (tree, snap) = setup(dir.path());
        let ib = allocate(
            &snap,
            &["mlx5_0-0001".into()],
            &tree.dev_root(),
            &DeviceHandoff::DeviceSpecs,
        )
        .unwrap();
        let p = paths(&ib);
        assert_eq!(p[0], "/dev/infiniband/rdma_cm");
        assert!(p.iter().any(|x| x.contains("uverbs")));
        assert!(p.iter().any(|x| x.contains("umad")));
        assert!(
            p.iter().any(|x| x.contains("issm")),
            "IB port gets issm: {p:?}"
        );
        assert!(ib.devices.iter().all(|d| d.permissions == "rw"));
        assert!(
            ib.devices
                .iter()
                .all(|d| d.host_path.starts_with(&*tree.dev_root().to_string_lossy()))
        );
        assert_eq!(ib.envs[DEVICES_ENV], "mlx5_0");
        assert_eq!(ib.mounts.len(), 1);
        assert!(ib.mounts[0].read_only);

        let eth = allocate(
            &snap,
            &["mlx5_1-0000".into()],
            &tree.dev_root(),
            &DeviceHandoff::DeviceSpecs,
        )
        .unwrap();
        let pe = paths(&eth);
        assert!(
            !pe.iter().any(|x| x.contains("issm")),
            "Ethernet gets no issm: {pe:?}"
        );
        // No device node of the other HCA leaks in.
        assert!(pe.iter().all(|x| !p[1..].contains(x)), "{pe:?} vs {p:?}");
        assert_eq!(eth.envs[DEVICES_ENV], "mlx5_1");

        let both = allocate(
            &snap,
            &[
                "mlx5_1-0000".into(),
                "mlx5_0-0000".into(),
                "mlx5_0-0001".into(),
            ],
            &tree.dev_root(),
            &DeviceHandoff::DeviceSpecs,
        )
        .unwrap();
        assert_eq!(both.envs[DEVICES_ENV], "mlx5_0,mlx5_1");
        assert_eq!(both.devices.len(), ib.devices.len() + eth.devices.len() - 1);
    }

    #[test]
    fn unknown_and_empty_ids_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let (tree, snap) = setup(dir.path());
        let err = allocate(
            &snap,
            &["mlx5_9-0000".into()],
            &tree.dev_root(),
            &DeviceHandoff::DeviceSpecs,
        )
        .unwrap_err();
        assert!(matches!(err, AllocateError::UnknownDevice { .. }));
        let err = allocate(&snap, &[], &tree.dev_root(), &DeviceHandoff::DeviceSpecs).unwrap_err();
        assert!(matches!(err, AllocateError::Empty { .. }));
    }

    #[test]
    fn cdi_names_and_no_specs() {
        let dir = tempfile::tempdir().unwrap();
        let (tree, snap) = setup(dir.path());
        let kind = "rdma-streams.io/hca".to_string();
        let resp = allocate(
            &snap,
            &["mlx5_0-0000".into(), "mlx5_1-0001".into()],
            &tree.dev_root(),
            &DeviceHandoff::Cdi { kind },
        )
        .unwrap();
        let names: Vec<_> = resp.cdi_devices.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(
            names,
            ["rdma-streams.io/hca=mlx5_0", "rdma-streams.io/hca=mlx5_1"]
        );
        assert!(resp.devices.is_empty() && resp.mounts.is_empty());
    }
}
