//! The config file: which pools (extended resources) to advertise and what goes into them.
//!
//! Native form (YAML; JSON is YAML too):
//!
//! ```yaml
//! # optional; seconds between periodic full-list re-sends to kubelet (hot-reloaded)
//! resyncSeconds: 30
//! pools:
//!   - resourceName: rdma-streams.io/hca      # extended resource name
//!     slotsPerHca: 64                        # >= 1, <= 10000 (default 64)
//!     selectors: { vendors: ["15b3"], linkLayers: [InfiniBand] }
//!     mounts:                                # optional, always read-only
//!       - hostPath: /opt/rdma-streams/shim/0.1.0
//!         containerPath: /opt/rdma-streams/shim
//! ```
//!
//! The config file of Mellanox's k8s-rdma-shared-dev-plugin (a top-level `configList`) is read
//! as well, so that migrating is a matter of pointing `--config` at the existing ConfigMap:
//!
//! ```json
//! {"periodicUpdateInterval": 300,
//!  "configList": [{"resourceName": "hca_shared_devices_a", "resourcePrefix": "rdma",
//!                  "rdmaHcaMax": 1000, "selectors": {"vendors": ["15b3"], "linkTypes": ["ether"]},
//!                  "devices": ["ib0"]}]}
//! ```
//!
//! How it maps:
//! - each `configList` entry becomes a pool named `<resourcePrefix>/<resourceName>`
//!   (`resourcePrefix` defaults to `rdma`, as in the Mellanox plugin);
//! - `rdmaHcaMax` becomes `slotsPerHca` (default [`DEFAULT_SLOTS_PER_HCA`] when absent). The
//!   meaning differs: Mellanox's `rdmaHcaMax` is the number of ids of the whole resource, and
//!   every one of its ids hands out **all** HCAs the selectors matched; here the number is per
//!   HCA, and each id names exactly one HCA. A node with two matching HCAs and
//!   `rdmaHcaMax: 1000` therefore advertises 2000 ids here, each giving one HCA;
//! - `selectors.linkTypes` becomes `linkLayers` (`ether`/`infiniband` are accepted);
//!   `vendors`, `deviceIDs`, `drivers` and `ifNames` keep their meaning;
//! - the deprecated `devices` list is added to `ifNames`;
//! - `periodicUpdateInterval` (seconds) becomes the resync period. Mellanox's `0` turns its
//!   periodic rediscovery off; here the periodic full-list re-send to kubelet is what keeps a
//!   lost update from sticking, so `0` (and an absent value) keep the default of 30 s.
//!
//! Unknown fields are errors in both forms, and parse errors carry the line and column.
//!
//! This module is pure: it reads and checks, and never looks at the node. Below it:
//! [`selector`] (which HCAs a pool takes) and `watch` (the file, reloaded while the plugin runs).

pub mod selector;
pub(crate) mod watch;

#[cfg(test)]
mod fuzz;

use std::collections::HashSet;
use std::fmt;
use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use rdma_streams_common::names::contract::DEFAULT_RESOURCE;
use rdma_streams_common::names::validate_extended_resource_name;
use serde::de::DeserializeOwned;
use serde::ser::SerializeStruct;
use serde::{Deserialize, Serialize, Serializer};
use thiserror::Error;
use tracing::info;

use self::selector::Selectors;

/// Slots per HCA when a pool does not say.
pub const DEFAULT_SLOTS_PER_HCA: u32 = 64;
/// Most slots one HCA may have (device ids are `<rdmadev>-<nnnn>`).
pub const MAX_SLOTS_PER_HCA: u32 = 10_000;
/// Resync period when the file does not say.
pub const DEFAULT_RESYNC: Duration = Duration::from_secs(30);
/// Longest resync period accepted (a day).
pub const MAX_RESYNC_SECONDS: u64 = 86_400;

/// The whole configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// Time between full rediscoveries and periodic full-list re-sends to kubelet.
    pub resync: Duration,
    /// One extended resource each.
    pub pools: Vec<PoolConfig>,
}

/// One pool: an extended resource with `slots_per_hca` device ids per matching HCA.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PoolConfig {
    /// Extended resource name (`domain/name`).
    pub resource_name: String,
    /// Device ids per matching HCA; how many containers can share one HCA.
    #[serde(default = "default_slots_per_hca")]
    pub slots_per_hca: u32,
    /// Which HCAs belong to the pool; empty selectors take every HCA.
    #[serde(default, skip_serializing_if = "Selectors::is_empty")]
    pub selectors: Selectors,
    /// Read-only bind mounts added to every allocation.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<MountConfig>,
}

/// A read-only mount handed to containers that get a slot of the pool.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MountConfig {
    pub host_path: PathBuf,
    pub container_path: PathBuf,
}

fn default_slots_per_hca() -> u32 {
    DEFAULT_SLOTS_PER_HCA
}

impl Default for Config {
    /// One pool, [`DEFAULT_RESOURCE`], of every RDMA device, [`DEFAULT_SLOTS_PER_HCA`] slots per
    /// HCA, no mounts.
    fn default() -> Self {
        Self {
            resync: DEFAULT_RESYNC,
            pools: vec![PoolConfig {
                resource_name: DEFAULT_RESOURCE.to_string(),
                slots_per_hca: DEFAULT_SLOTS_PER_HCA,
                selectors: Selectors::default(),
                mounts: Vec::new(),
            }],
        }
    }
}

/// Serialises in the native file form, so `discover -o yaml` output is a valid config.
impl Serialize for Config {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut s = serializer.serialize_struct("Config", 2)?;
        s.serialize_field("resyncSeconds", &self.resync.as_secs())?;
        s.serialize_field("pools", &self.pools)?;
        s.end()
    }
}

impl Config {
    /// Checks what serde cannot: at least one pool, unique and valid resource names,
    /// `slotsPerHca` in `1..=10000`, valid selectors, absolute mount paths without `..`,
    /// container paths unique within a pool and not under `/dev`, a resync period of 1 s to a
    /// day. All problems are reported, separated by `; `, each naming the pool index and
    /// resource.
    pub fn validate(&self) -> Result<(), String> {
        let mut problems = Vec::new();
        let secs = self.resync.as_secs();
        if self.resync.subsec_nanos() != 0 || !(1..=MAX_RESYNC_SECONDS).contains(&secs) {
            problems.push(format!(
                "resyncSeconds: {:?} is out of range (1 to {MAX_RESYNC_SECONDS} whole seconds)",
                self.resync
            ));
        }
        if self.pools.is_empty() {
            problems.push("pools: at least one pool is needed".to_string());
        }
        let mut names = HashSet::new();
        for (i, pool) in self.pools.iter().enumerate() {
            let mut problem = |what: String| {
                problems.push(format!("pools[{i}] ({}): {what}", pool.resource_name));
            };
            if let Err(e) = validate_extended_resource_name(&pool.resource_name) {
                problem(e.to_string());
            }
            if !names.insert(pool.resource_name.as_str()) {
                problem("resourceName is used by an earlier pool".to_string());
            }
            if !(1..=MAX_SLOTS_PER_HCA).contains(&pool.slots_per_hca) {
                problem(format!(
                    "slotsPerHca {} is out of range (1 to {MAX_SLOTS_PER_HCA})",
                    pool.slots_per_hca
                ));
            }
            if let Err(e) = pool.selectors.validate() {
                problem(format!("selectors.{e}"));
            }
            let mut container_paths = HashSet::new();
            for (j, m) in pool.mounts.iter().enumerate() {
                for (field, path) in [
                    ("hostPath", &m.host_path),
                    ("containerPath", &m.container_path),
                ] {
                    if let Err(e) = check_mount_path(path) {
                        problem(format!("mounts[{j}].{field} `{}` {e}", path.display()));
                    }
                }
                if m.container_path.starts_with("/dev") {
                    problem(format!(
                        "mounts[{j}].containerPath `{}` is under /dev, which belongs to the \
                         device nodes",
                        m.container_path.display()
                    ));
                }
                if !container_paths.insert(&m.container_path) {
                    problem(format!(
                        "mounts[{j}].containerPath `{}` is mounted twice",
                        m.container_path.display()
                    ));
                }
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems.join("; "))
        }
    }
}

/// Absolute, not `/` itself, no `..` components.
fn check_mount_path(path: &Path) -> Result<(), &'static str> {
    if !path.is_absolute() {
        return Err("is not absolute");
    }
    if path.components().any(|c| c == Component::ParentDir) {
        return Err("contains `..`");
    }
    if path.parent().is_none() {
        return Err("is the root directory");
    }
    Ok(())
}

/// Where in the text a parse error is (1-based).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TextLocation {
    pub line: usize,
    pub column: usize,
}

impl fmt::Display for TextLocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {} column {}", self.line, self.column)
    }
}

/// Why a config could not be used.
#[derive(Debug, Error)]
pub enum ConfigError {
    /// The file exists but cannot be read.
    #[error("cannot read config {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The text is not YAML, or does not fit the config model.
    #[error(
        "cannot parse config {}{}: {message}",
        path.display(),
        location.map(|l| format!(" at {l}")).unwrap_or_default()
    )]
    Parse {
        path: PathBuf,
        location: Option<TextLocation>,
        message: String,
    },
    /// The config parsed but breaks a rule ([`Config::validate`]).
    #[error("invalid config {}: {message}", path.display())]
    Invalid { path: PathBuf, message: String },
}

impl ConfigError {
    fn parse(origin: &str, err: &rdma_streams_yaml::Error) -> Self {
        let location = err.line().map(|line| TextLocation {
            line,
            column: err.column().unwrap_or(1),
        });
        Self::Parse {
            path: PathBuf::from(origin),
            location,
            message: err.message().to_owned(),
        }
    }
}

/// Reads the config at `path`.
///
/// `None`, or a path that does not exist, gives [`Config::default`] (logged at info). A file
/// that cannot be read, parsed or validated is an error.
pub fn load(path: Option<&Path>) -> Result<Config, ConfigError> {
    let Some(path) = path else {
        info!(
            resource = DEFAULT_RESOURCE,
            "no config file given; using the default pool of all RDMA devices"
        );
        return Ok(Config::default());
    };
    match std::fs::read_to_string(path) {
        Ok(text) => parse(&text, &path.display().to_string()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            info!(
                path = %path.display(),
                resource = DEFAULT_RESOURCE,
                "config file does not exist; using the default pool of all RDMA devices"
            );
            Ok(Config::default())
        }
        Err(source) => Err(ConfigError::Read {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// Parses and validates config text; `origin` names it in errors (usually the file path).
///
/// A top-level `configList` key selects the Mellanox format, anything else the native one.
/// The YAML is read with the workspace's options (bounded nesting, aliases and size:
/// `rdma_streams_yaml`).
pub fn parse(text: &str, origin: &str) -> Result<Config, ConfigError> {
    let peek: serde_json::Value =
        rdma_streams_yaml::from_str(text).map_err(|e| ConfigError::parse(origin, &e))?;
    let config = match &peek {
        serde_json::Value::Null => {
            return Err(ConfigError::Parse {
                path: PathBuf::from(origin),
                location: None,
                message: "the file is empty; give at least one pool, or remove the file to use \
                          the default pool"
                    .to_string(),
            });
        }
        serde_json::Value::Object(m) if m.contains_key("configList") => {
            // Deserialise the text, not `peek`, so that errors keep their line and column.
            typed::<MellanoxConfig>(text, origin)?.into_config()
        }
        _ => typed::<NativeConfig>(text, origin)?.into_config(),
    };
    config.validate().map_err(|message| ConfigError::Invalid {
        path: PathBuf::from(origin),
        message,
    })?;
    Ok(config)
}

fn typed<T: DeserializeOwned>(text: &str, origin: &str) -> Result<T, ConfigError> {
    rdma_streams_yaml::from_str(text).map_err(|e| ConfigError::parse(origin, &e))
}

/// The native file layout.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct NativeConfig {
    #[serde(default)]
    resync_seconds: Option<u64>,
    pools: Vec<PoolConfig>,
}

impl NativeConfig {
    fn into_config(self) -> Config {
        Config {
            resync: self
                .resync_seconds
                .map_or(DEFAULT_RESYNC, Duration::from_secs),
            pools: self.pools,
        }
    }
}

/// The Mellanox k8s-rdma-shared-dev-plugin file layout (see the module docs for the mapping).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct MellanoxConfig {
    #[serde(default)]
    periodic_update_interval: Option<u64>,
    config_list: Vec<MellanoxEntry>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct MellanoxEntry {
    resource_name: String,
    #[serde(default)]
    resource_prefix: Option<String>,
    #[serde(default)]
    rdma_hca_max: Option<u32>,
    #[serde(default)]
    selectors: MellanoxSelectors,
    #[serde(default)]
    devices: Vec<String>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct MellanoxSelectors {
    #[serde(default)]
    vendors: Vec<String>,
    #[serde(default, rename = "deviceIDs")]
    device_ids: Vec<String>,
    #[serde(default)]
    drivers: Vec<String>,
    #[serde(default)]
    if_names: Vec<String>,
    #[serde(default)]
    link_types: Vec<String>,
}

/// The default `resourcePrefix` of the Mellanox plugin.
const MELLANOX_DEFAULT_PREFIX: &str = "rdma";

impl MellanoxConfig {
    fn into_config(self) -> Config {
        let resync = match self.periodic_update_interval {
            None | Some(0) => DEFAULT_RESYNC,
            Some(secs) => Duration::from_secs(secs),
        };
        let pools = self
            .config_list
            .into_iter()
            .map(|e| {
                let prefix = e
                    .resource_prefix
                    .unwrap_or_else(|| MELLANOX_DEFAULT_PREFIX.to_string());
                let mut if_names = e.selectors.if_names;
                for d in e.devices {
                    if !if_names.contains(&d) {
                        if_names.push(d);
                    }
                }
                PoolConfig {
                    resource_name: format!("{prefix}/{}", e.resource_name),
                    slots_per_hca: e.rdma_hca_max.unwrap_or(DEFAULT_SLOTS_PER_HCA),
                    selectors: Selectors {
                        vendors: e.selectors.vendors,
                        device_ids: e.selectors.device_ids,
                        drivers: e.selectors.drivers,
                        if_names,
                        link_layers: e.selectors.link_types,
                        ..Selectors::default()
                    },
                    mounts: Vec::new(),
                }
            })
            .collect();
        Config { resync, pools }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_ok(text: &str) -> Config {
        match parse(text, "test.yaml") {
            Ok(c) => c,
            Err(e) => panic!("unexpected error: {e}"),
        }
    }

    fn parse_err(text: &str) -> String {
        match parse(text, "/etc/rdma/config.yaml") {
            Ok(c) => panic!("expected an error, got {c:?}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn native_file() {
        let c = parse_ok(
            r#"
# comment
resyncSeconds: 45
pools:
  - resourceName: rdma-streams.io/hca
    slotsPerHca: 64
    selectors: { vendors: ["15b3"], linkLayers: [InfiniBand] }
    mounts:
      - hostPath: /opt/rdma-streams/shim/0.1.0
        containerPath: /opt/rdma-streams/shim
  - resourceName: rdma-streams.io/roce
    selectors:
      linkLayers: [Ethernet]
      rdmaDevices: ["mlx5_*"]
"#,
        );
        assert_eq!(c.resync, Duration::from_secs(45));
        assert_eq!(c.pools.len(), 2);
        let p = &c.pools[0];
        assert_eq!(p.resource_name, "rdma-streams.io/hca");
        assert_eq!(p.slots_per_hca, 64);
        assert_eq!(p.selectors.vendors, ["15b3"]);
        assert_eq!(p.selectors.link_layers, ["InfiniBand"]);
        assert_eq!(
            p.mounts,
            [MountConfig {
                host_path: "/opt/rdma-streams/shim/0.1.0".into(),
                container_path: "/opt/rdma-streams/shim".into(),
            }]
        );
        let q = &c.pools[1];
        assert_eq!(q.slots_per_hca, DEFAULT_SLOTS_PER_HCA);
        assert_eq!(q.selectors.rdma_devices, ["mlx5_*"]);
        assert!(q.mounts.is_empty());

        // Serialising gives the native form back.
        let text = rdma_streams_yaml::to_string(&c).expect("serialize");
        assert_eq!(parse_ok(&text), c);
    }

    #[test]
    fn json_file_and_defaults() {
        let c = parse_ok(r#"{"pools": [{"resourceName": "example.com/rdma"}]}"#);
        assert_eq!(c.resync, DEFAULT_RESYNC);
        assert_eq!(c.pools[0].resource_name, "example.com/rdma");
        assert_eq!(c.pools[0].slots_per_hca, DEFAULT_SLOTS_PER_HCA);
        assert!(c.pools[0].selectors.is_empty());
    }

    #[test]
    fn default_config() {
        let c = Config::default();
        assert_eq!(c.validate(), Ok(()));
        assert_eq!(c.resync, Duration::from_secs(30));
        assert_eq!(c.pools.len(), 1);
        assert_eq!(c.pools[0].resource_name, DEFAULT_RESOURCE);
        assert_eq!(c.pools[0].slots_per_hca, 64);
        assert!(c.pools[0].selectors.is_empty() && c.pools[0].mounts.is_empty());
        assert_eq!(load(None).expect("default"), c);
        let dir = tempfile::tempdir().expect("tempdir");
        assert_eq!(
            load(Some(&dir.path().join("missing.yaml"))).expect("default"),
            c
        );
    }

    #[test]
    fn load_reads_files_and_reports_paths() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("config.yaml");
        std::fs::write(&path, "pools:\n  - resourceName: a.io/b\n").expect("write");
        assert_eq!(
            load(Some(&path)).expect("load").pools[0].resource_name,
            "a.io/b"
        );

        std::fs::write(&path, "pools: []\n").expect("write");
        let err = load(Some(&path)).expect_err("no pools");
        assert!(matches!(err, ConfigError::Invalid { .. }));
        assert!(
            err.to_string().contains(&path.display().to_string()),
            "{err}"
        );

        // A directory cannot be read as a file.
        let err = load(Some(dir.path())).expect_err("directory");
        assert!(matches!(err, ConfigError::Read { .. }), "{err}");
    }

    #[test]
    fn mellanox_file() {
        let c = parse_ok(
            r#"{
  "periodicUpdateInterval": 300,
  "configList": [
    {
      "resourceName": "hca_shared_devices_a",
      "rdmaHcaMax": 1000,
      "selectors": {"vendors": ["15b3"], "deviceIDs": ["1017"], "ifNames": ["ens1f0"]},
      "devices": ["ens1f1", "ens1f0"]
    },
    {
      "resourceName": "hca_shared_devices_b",
      "resourcePrefix": "example.com",
      "rdmaHcaMax": 500,
      "selectors": {"drivers": ["mlx5_core"], "linkTypes": ["ether"]}
    }
  ]
}"#,
        );
        assert_eq!(c.resync, Duration::from_secs(300));
        let a = &c.pools[0];
        assert_eq!(a.resource_name, "rdma/hca_shared_devices_a");
        assert_eq!(a.slots_per_hca, 1000);
        assert_eq!(a.selectors.vendors, ["15b3"]);
        assert_eq!(a.selectors.device_ids, ["1017"]);
        assert_eq!(a.selectors.if_names, ["ens1f0", "ens1f1"]);
        let b = &c.pools[1];
        assert_eq!(b.resource_name, "example.com/hca_shared_devices_b");
        assert_eq!(b.slots_per_hca, 500);
        assert_eq!(b.selectors.drivers, ["mlx5_core"]);
        assert_eq!(b.selectors.link_layers, ["ether"]);
    }

    #[test]
    fn mellanox_zero_interval_keeps_default_resync() {
        let c = parse_ok(
            "periodicUpdateInterval: 0\nconfigList:\n  - resourceName: hca\n    rdmaHcaMax: 10\n",
        );
        assert_eq!(c.resync, DEFAULT_RESYNC);
        assert_eq!(c.pools[0].resource_name, "rdma/hca");
    }

    #[test]
    fn mellanox_unknown_field() {
        let err = parse_err(
            "configList:\n  - resourceName: hca\n    rdmaHcaMax: 10\n    deviceType: netDevice\n",
        );
        assert!(err.contains("unknown field `deviceType`"), "{err}");
        assert!(err.contains("line 4 column 5"), "{err}");
    }

    #[test]
    fn unknown_field_has_line_and_column() {
        let err = parse_err(
            "pools:\n  - resourceName: rdma-streams.io/hca\n    slotsPerHca: 8\n    slotPerHca: 8\n",
        );
        assert!(err.contains("/etc/rdma/config.yaml"), "{err}");
        assert!(err.contains("line 4 column 5"), "{err}");
        assert!(err.contains("unknown field `slotPerHca`"), "{err}");
        // The location is printed once.
        assert_eq!(err.matches("line 4").count(), 1, "{err}");

        let err =
            parse_err("pools:\n  - resourceName: a.io/b\n    selectors:\n      vendor: [x]\n");
        assert!(err.contains("line 4 column 7"), "{err}");
        assert!(err.contains("unknown field `vendor`"), "{err}");

        let err = parse_err("resync: 30\npools: []\n");
        assert!(err.contains("line 1 column 1"), "{err}");
    }

    #[test]
    fn yaml_syntax_error_and_empty_file() {
        let err = parse_err("pools:\n  - resourceName: [a\n");
        assert!(
            err.contains("cannot parse config /etc/rdma/config.yaml"),
            "{err}"
        );
        assert!(err.contains("at line 2 column 19: "), "{err}");
        assert!(err.contains("unclosed bracket"), "{err}");
        assert_eq!(err.matches("line 2 column 19").count(), 1, "{err}");
        let err = parse_err("# nothing\n");
        assert!(err.contains("empty"), "{err}");
        let err = parse_err("pools:\n  - resourceName: a.io/b\n    slotsPerHca: -1\n");
        assert!(err.contains("line 3 column 18"), "{err}");
    }

    #[test]
    fn duplicate_resource_names() {
        let err = parse_err("pools:\n  - resourceName: a.io/b\n  - resourceName: a.io/b\n");
        assert!(
            err.contains("invalid config /etc/rdma/config.yaml"),
            "{err}"
        );
        assert!(err.contains("pools[1] (a.io/b)"), "{err}");
        assert!(err.contains("earlier pool"), "{err}");
    }

    #[test]
    fn bad_resource_names() {
        let err = parse_err("pools:\n  - resourceName: hca\n");
        assert!(
            err.contains("pools[0] (hca)") && err.contains("no domain"),
            "{err}"
        );
        let err =
            parse_err("pools:\n  - resourceName: a.io/b\n  - resourceName: kubernetes.io/x\n");
        assert!(err.contains("pools[1] (kubernetes.io/x)"), "{err}");
        assert!(err.contains("reserved"), "{err}");
        // A Mellanox prefix that makes a reserved name.
        let err =
            parse_err("configList:\n  - resourceName: x\n    resourcePrefix: kubernetes.io\n");
        assert!(err.contains("reserved"), "{err}");
    }

    #[test]
    fn slots_out_of_range() {
        let err = parse_err("pools:\n  - resourceName: a.io/b\n    slotsPerHca: 0\n");
        assert!(
            err.contains("pools[0] (a.io/b): slotsPerHca 0 is out of range"),
            "{err}"
        );
        let err = parse_err("pools:\n  - resourceName: a.io/b\n    slotsPerHca: 10001\n");
        assert!(err.contains("slotsPerHca 10001"), "{err}");
        let err = parse_err("configList:\n  - resourceName: hca\n    rdmaHcaMax: 0\n");
        assert!(err.contains("pools[0] (rdma/hca): slotsPerHca 0"), "{err}");
        parse_ok("pools:\n  - resourceName: a.io/b\n    slotsPerHca: 10000\n");
    }

    #[test]
    fn resync_out_of_range() {
        let err = parse_err("resyncSeconds: 0\npools:\n  - resourceName: a.io/b\n");
        assert!(err.contains("resyncSeconds"), "{err}");
    }

    #[test]
    fn bad_mounts() {
        let pool =
            |mounts: &str| format!("pools:\n  - resourceName: a.io/b\n    mounts: {mounts}\n");
        let err = parse_err(&pool("[{hostPath: opt/shim, containerPath: /opt/shim}]"));
        assert!(
            err.contains("pools[0] (a.io/b): mounts[0].hostPath `opt/shim` is not absolute"),
            "{err}"
        );
        let err = parse_err(&pool("[{hostPath: /opt/shim, containerPath: shim}]"));
        assert!(
            err.contains("mounts[0].containerPath `shim` is not absolute"),
            "{err}"
        );
        let err = parse_err(&pool("[{hostPath: /opt/shim, containerPath: /dev/shim}]"));
        assert!(err.contains("under /dev"), "{err}");
        let err = parse_err(&pool(
            "[{hostPath: /opt/shim, containerPath: /opt/../dev/x}]",
        ));
        assert!(err.contains("contains `..`"), "{err}");
        let err = parse_err(&pool(
            "[{hostPath: /a, containerPath: /opt/shim}, {hostPath: /b, containerPath: /opt/shim}]",
        ));
        assert!(
            err.contains("mounts[1].containerPath `/opt/shim` is mounted twice"),
            "{err}"
        );
        let err = parse_err(&pool("[{hostPath: /a, containerPath: /x, readOnly: true}]"));
        assert!(err.contains("unknown field `readOnly`"), "{err}");
        // `/device` is not under `/dev`.
        parse_ok(&pool("[{hostPath: /a, containerPath: /device}]"));
    }

    #[test]
    fn bad_glob_and_link_layer() {
        let err = parse_err(
            "pools:\n  - resourceName: a.io/b\n    selectors: {rdmaDevices: ['mlx5_[']}\n",
        );
        assert!(
            err.contains("pools[0] (a.io/b): selectors.rdmaDevices"),
            "{err}"
        );
        let err =
            parse_err("configList:\n  - resourceName: hca\n    selectors: {linkTypes: [iwarp]}\n");
        assert!(err.contains("selectors.linkLayers: `iwarp`"), "{err}");
    }

    #[test]
    fn all_problems_are_reported() {
        let err = parse_err(
            "pools:\n  - resourceName: hca\n    slotsPerHca: 0\n  - resourceName: a.io/b\n    \
             mounts: [{hostPath: x, containerPath: /y}]\n",
        );
        assert!(err.contains("pools[0] (hca): resource name"), "{err}");
        assert!(err.contains("pools[0] (hca): slotsPerHca 0"), "{err}");
        assert!(
            err.contains("pools[1] (a.io/b): mounts[0].hostPath"),
            "{err}"
        );
    }
}
