//! CDI mode: one spec file per pool in `--cdi-dir`, written atomically, named devices per HCA.
//!
//! The spec names each HCA as a CDI device (`<kind>=<rdmadev>`) carrying its own char devices;
//! `rdma_cm` and the pool's read-only mounts are spec-wide container edits, applied once when
//! any device of the spec is injected. Allocate then answers with `cdi_devices` (GA in 1.31).

use std::{
    fs, io,
    path::{Path, PathBuf},
};

use rdma_streams_common::{atomic_file, names::contract::DOMAIN};
use serde_json::{Value, json};

use super::{
    allocate::{CONTAINER_DEV_DIR, hca_char_devices},
    pool::PoolSnapshot,
};
use crate::inventory::hca::CharDev;

/// CDI spec version written (hostPath in deviceNodes needs >= 0.5.0).
pub const CDI_VERSION: &str = "0.6.0";
/// File name prefix of the specs this plugin owns, so stale ones can be cleaned at start.
pub const SPEC_PREFIX: &str = "rdma-streams-dp_";

#[derive(Debug, thiserror::Error)]
pub enum CdiError {
    #[error("writing CDI spec {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// The CDI kind (`vendor/class`) for an extended resource name: the class may not hold dots
/// (`rdma/hca.a` gives `rdma/hca-a`).
pub fn cdi_kind(resource_name: &str) -> String {
    match resource_name.split_once('/') {
        Some((vendor, class)) => format!("{vendor}/{}", class.replace('.', "-")),
        None => format!("{DOMAIN}/{}", resource_name.replace('.', "-")),
    }
}

/// The spec file of a pool.
pub fn spec_path(cdi_dir: &Path, resource_name: &str) -> PathBuf {
    let safe: String = resource_name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    cdi_dir.join(format!("{SPEC_PREFIX}{safe}.json"))
}

fn node(dev_root: &Path, dev: &CharDev) -> Value {
    json!({
        "path": format!("{CONTAINER_DEV_DIR}/{}", dev.name),
        "hostPath": dev_root.join(dev.rel_path()).to_string_lossy(),
        "permissions": "rw",
    })
}

/// The spec of a pool. HCAs with a missing char device are left out (they are unhealthy and
/// the runtime would refuse to inject them).
pub fn spec(snapshot: &PoolSnapshot, dev_root: &Path) -> Value {
    let devices: Vec<Value> = snapshot
        .hcas
        .values()
        .filter(|h| hca_char_devices(h).all(|c| c.present))
        .map(|h| {
            let nodes: Vec<Value> = hca_char_devices(h).map(|c| node(dev_root, c)).collect();
            json!({ "name": h.name, "containerEdits": { "deviceNodes": nodes } })
        })
        .collect();
    let mounts: Vec<Value> = snapshot
        .mounts
        .iter()
        .map(|m| {
            json!({
                "hostPath": m.host_path.to_string_lossy(),
                "containerPath": m.container_path.to_string_lossy(),
                "options": ["ro", "nosuid", "nodev", "rbind"],
            })
        })
        .collect();
    let mut edits = json!({ "deviceNodes": [node(dev_root, &snapshot.rdma_cm)] });
    if !mounts.is_empty() {
        edits["mounts"] = Value::Array(mounts);
    }
    json!({
        "cdiVersion": CDI_VERSION,
        "kind": cdi_kind(&snapshot.resource_name),
        "devices": devices,
        "containerEdits": edits,
    })
}

/// Writes the pool's spec atomically (a temporary file of its own in the same folder, fsync,
/// rename: the manager and every pool's runner may write at once). Returns whether the file
/// changed.
pub fn write_spec(
    cdi_dir: &Path,
    snapshot: &PoolSnapshot,
    dev_root: &Path,
) -> Result<bool, CdiError> {
    let path = spec_path(cdi_dir, &snapshot.resource_name);
    let err = |source| CdiError::Write {
        path: path.clone(),
        source,
    };
    let mut text = serde_json::to_vec_pretty(&spec(snapshot, dev_root))
        .map_err(io::Error::other)
        .map_err(err)?;
    text.push(b'\n');
    if fs::read(&path).is_ok_and(|old| old == text) {
        return Ok(false);
    }
    fs::create_dir_all(cdi_dir).map_err(err)?;
    // Readable by the container runtime, as a file `File::create` makes would be.
    atomic_file::write_atomic(&path, &text, 0o644, true).map_err(err)?;
    Ok(true)
}

/// Removes one pool's spec (pool removed from the config).
pub fn remove_spec(cdi_dir: &Path, resource_name: &str) {
    let _ = fs::remove_file(spec_path(cdi_dir, resource_name));
}

/// Removes every spec this plugin wrote before (start-up clean-up), keeping `keep`.
pub fn clean_stale(cdi_dir: &Path, keep: &[PathBuf]) -> usize {
    let Ok(entries) = fs::read_dir(cdi_dir) else {
        return 0;
    };
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let ours = name.starts_with(SPEC_PREFIX) || name.starts_with(&format!(".{SPEC_PREFIX}"));
        if ours && !keep.contains(&entry.path()) && fs::remove_file(entry.path()).is_ok() {
            removed += 1;
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::config::{Config, MountConfig, PoolConfig};
    use rdma_device_plugin_testkit::fixture::{FixtureTree, HcaSpec};

    #[test]
    fn kinds() {
        assert_eq!(cdi_kind("rdma-streams.io/hca"), "rdma-streams.io/hca");
        assert_eq!(cdi_kind("rdma/hca.shared"), "rdma/hca-shared");
    }

    #[test]
    fn spec_contents_and_atomic_write() {
        let dir = tempfile::tempdir().unwrap();
        let tree = FixtureTree::new(dir.path().join("node")).unwrap();
        tree.add_hca(HcaSpec::connectx_ib("mlx5_0", "0000:3b:00.0"))
            .unwrap();
        tree.add_hca(HcaSpec::connectx_eth("mlx5_1", "0000:5e:00.0"))
            .unwrap();
        let inv =
            crate::inventory::discovery::discover(&tree.sys_root(), &tree.dev_root()).unwrap();
        let pool = PoolConfig {
            mounts: vec![MountConfig {
                host_path: "/opt/rdma-streams/shim/0.1.0".into(),
                container_path: "/opt/rdma-streams/shim".into(),
            }],
            ..Config::default().pools[0].clone()
        };
        let snap = PoolSnapshot::build(&pool, &inv, crate::config::DEFAULT_RESYNC);
        let cdi = dir.path().join("cdi");
        fs::create_dir_all(&cdi).unwrap();
        fs::write(cdi.join(format!("{SPEC_PREFIX}old.json")), "{}").unwrap();
        fs::write(cdi.join("other-vendor.json"), "{}").unwrap();
        assert_eq!(clean_stale(&cdi, &[]), 1);
        assert!(cdi.join("other-vendor.json").exists());

        assert!(write_spec(&cdi, &snap, &tree.dev_root()).unwrap());
        assert!(
            !write_spec(&cdi, &snap, &tree.dev_root()).unwrap(),
            "unchanged"
        );
        let text = fs::read_to_string(spec_path(&cdi, "rdma-streams.io/hca")).unwrap();
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["kind"], "rdma-streams.io/hca");
        assert_eq!(v["cdiVersion"], CDI_VERSION);
        let devs = v["devices"].as_array().unwrap();
        assert_eq!(devs.len(), 2);
        assert_eq!(devs[0]["name"], "mlx5_0");
        let nodes0 = devs[0]["containerEdits"]["deviceNodes"].as_array().unwrap();
        assert!(
            nodes0
                .iter()
                .any(|n| n["path"].as_str().unwrap().contains("issm"))
        );
        let nodes1 = devs[1]["containerEdits"]["deviceNodes"].as_array().unwrap();
        assert!(
            !nodes1
                .iter()
                .any(|n| n["path"].as_str().unwrap().contains("issm"))
        );
        assert_eq!(
            v["containerEdits"]["deviceNodes"][0]["path"],
            "/dev/infiniband/rdma_cm"
        );
        assert_eq!(v["containerEdits"]["mounts"][0]["options"][0], "ro");
        // Only the spec is left, no temp file.
        let names: Vec<_> = fs::read_dir(&cdi)
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(names.len(), 2, "{names:?}");
        remove_spec(&cdi, "rdma-streams.io/hca");
        assert!(!spec_path(&cdi, "rdma-streams.io/hca").exists());
    }

    /// The manager task and every pool's runner write specs at once (a two-worker runtime):
    /// each write goes through a temporary file of its own, so no pool's spec lands on
    /// another's path and no write fails for another's rename.
    #[test]
    fn many_pools_writing_at_once_each_get_their_own_spec() {
        let dir = tempfile::tempdir().unwrap();
        let tree = FixtureTree::new(dir.path().join("node")).unwrap();
        tree.add_hca(HcaSpec::connectx_ib("mlx5_0", "0000:3b:00.0"))
            .unwrap();
        let inv =
            crate::inventory::discovery::discover(&tree.sys_root(), &tree.dev_root()).unwrap();
        let cdi = Arc::new(dir.path().join("cdi"));
        let dev_root = Arc::new(tree.dev_root());
        let pools: Vec<PoolSnapshot> = (0..8)
            .map(|i| {
                let pool = PoolConfig {
                    resource_name: format!("rdma-streams.io/pool{i}"),
                    ..Config::default().pools[0].clone()
                };
                PoolSnapshot::build(&pool, &inv, crate::config::DEFAULT_RESYNC)
            })
            .collect();
        let writers: Vec<_> = pools
            .into_iter()
            .map(|snap| {
                let (cdi, dev_root) = (Arc::clone(&cdi), Arc::clone(&dev_root));
                std::thread::spawn(move || {
                    for _ in 0..200 {
                        remove_spec(&cdi, &snap.resource_name);
                        write_spec(&cdi, &snap, &dev_root).map_err(|e| format!("{e:#?}"))?;
                    }
                    Ok::<_, String>(snap.resource_name)
                })
            })
            .collect();
        for writer in writers {
            let name = writer.join().unwrap().unwrap();
            let text = fs::read_to_string(spec_path(&cdi, &name)).unwrap();
            let v: Value = serde_json::from_str(&text).unwrap();
            assert_eq!(v["kind"], cdi_kind(&name), "{name}'s spec holds another's");
        }
        let left: Vec<_> = fs::read_dir(&*cdi)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with('.'))
            .collect();
        assert!(left.is_empty(), "temporary files left: {left:?}");
    }
}
