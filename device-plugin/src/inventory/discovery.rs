//! Discovery: the node's RDMA inventory, read from a sysfs tree and a dev tree.
//!
//! Only the two roots given are read, in the kernel's layout:
//!
//! - `class/infiniband/<dev>`: one RDMA device each (a link into `devices/...`). Its
//!   `device` link names the PCI function, or for a Mellanox sub-function the auxiliary device
//!   `mlx5_core.sf.N` whose parent directory is the PCI function. The bus comes from that
//!   device's `subsystem` link (`pci`, `auxiliary`), else from the shape of its name. No
//!   `device` link means a software device ([`Bus::Virtual`]).
//! - From the PCI function (the parent's for an SF): `vendor`, `device`, `numa_node`. From the
//!   device itself (the SF's own auxiliary device for an SF): the `driver` link and `net/*`.
//! - `ports/<n>/{state,phys_state,link_layer}` and `ports/<n>/gid_attrs/ndevs/*` (netdev
//!   names; unreadable or empty entries are unused GIDs and skipped).
//! - `class/infiniband_verbs/uverbs*/ibdev`, `class/infiniband_mad/{umad*,issm*}/{ibdev,port}`.
//!   `issm` is listed only for InfiniBand ports (the kernel creates one for RoCE ports too).
//! - `<dev_root>/infiniband/<name>`: a char device is `present` when that path exists.
//!
//! An odd tree never aborts discovery: a device with missing files, garbage content or a
//! dangling link is kept with what could be read (the rest `None`/empty), logged with
//! `warn!`, and [`crate::inventory::health::assess`] gives it its reasons. Only unreadable roots are
//! errors. A missing `class/infiniband` is a node whose driver is not loaded yet: an empty
//! inventory.
//!
//! Links are followed only when they resolve inside the sysfs root.

use std::{
    collections::BTreeMap,
    fs, io,
    path::{Path, PathBuf},
};

use rdma_streams_common::report::Report;
use tracing::{debug, warn};

use super::{
    hca::{Bus, CharDev, CharDevKind, Hca, Health, Inventory, LinkLayer, Port},
    health::assess,
    netns_mode::NetnsMode,
};

/// Discovery could not read one of its roots at all.
#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    /// The sysfs root does not exist or cannot be resolved.
    #[error("sysfs root {path} is not readable")]
    SysRoot {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// `class/infiniband` exists but cannot be listed.
    #[error("{path} cannot be listed")]
    ClassDir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// The dev root does not exist or is not a directory.
    #[error("dev root {path} is not readable")]
    DevRoot {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// Reads the inventory of the node whose sysfs is `sys_root` (`/sys`) and whose device nodes
/// are below `dev_root` (`/dev`). HCAs come sorted by name, ports by number, and each HCA's
/// [`Hca::health`] is filled in by [`assess`].
pub fn discover(sys_root: &Path, dev_root: &Path) -> Result<Inventory, DiscoveryError> {
    let root = fs::canonicalize(sys_root).map_err(|source| DiscoveryError::SysRoot {
        path: sys_root.to_path_buf(),
        source,
    })?;
    let dev_root = check_dev_root(dev_root)?;
    let sys = Sysfs { root };
    let rdma_cm = CharDev {
        present: dev_root.join("infiniband/rdma_cm").exists(),
        ..CharDev::default()
    };

    let class_path = sys.root.join("class/infiniband");
    let entries = match fs::read_dir(&class_path) {
        Ok(rd) => rd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            debug!(path = %class_path.display(), "no class/infiniband: RDMA driver not loaded");
            return Ok(Inventory {
                hcas: Vec::new(),
                rdma_cm,
                netns_mode: NetnsMode::read(&sys.root),
            });
        }
        Err(source) => {
            return Err(DiscoveryError::ClassDir {
                path: class_path,
                source,
            });
        }
    };
    let mut names = Vec::new();
    for entry in entries {
        match entry {
            Ok(e) => match e.file_name().into_string() {
                Ok(name) => names.push(name),
                Err(raw) => warn!(name = ?raw, "skipping non-UTF-8 class/infiniband entry"),
            },
            Err(error) => {
                warn!(path = %class_path.display(), error = %Report(&error), "class/infiniband entry unreadable")
            }
        }
    }
    names.sort();

    let char_devs = CharDevIndex::read(&sys);
    let hcas = names
        .into_iter()
        .map(|name| {
            let mut hca = read_hca(&sys, &class_path, &name, &char_devs, &dev_root);
            hca.health = assess(&hca, rdma_cm.present);
            hca
        })
        .collect();
    Ok(Inventory {
        hcas,
        rdma_cm,
        netns_mode: NetnsMode::read(&sys.root),
    })
}

fn check_dev_root(dev_root: &Path) -> Result<PathBuf, DiscoveryError> {
    let err = |source| DiscoveryError::DevRoot {
        path: dev_root.to_path_buf(),
        source,
    };
    let meta = fs::metadata(dev_root).map_err(err)?;
    if !meta.is_dir() {
        return Err(err(io::Error::new(
            io::ErrorKind::NotADirectory,
            "not a directory",
        )));
    }
    Ok(dev_root.to_path_buf())
}

/// Reads one `class/infiniband/<name>` entry; never fails, degrades instead.
fn read_hca(
    sys: &Sysfs,
    class_path: &Path,
    name: &str,
    char_devs: &CharDevIndex,
    dev_root: &Path,
) -> Hca {
    let mut hca = Hca {
        name: name.to_string(),
        bus: Bus::Virtual,
        vendor: None,
        device_id: None,
        driver: None,
        numa_node: None,
        netdevs: Vec::new(),
        ports: Vec::new(),
        char_devices: Vec::new(),
        health: Health::healthy(),
    };
    let class_entry = class_path.join(name);
    let Some(ib_dir) = sys.dir(&class_entry) else {
        // The class entry dangles: its device directory is gone with the PCI function. Keep
        // the name and what the link text tells about the bus.
        warn!(hca = name, path = %class_entry.display(), "RDMA device directory missing (dangling class link)");
        hca.bus = fs::read_link(&class_entry)
            .ok()
            .and_then(|t| bus_from_link_text(&t))
            .unwrap_or(Bus::Virtual);
        return hca;
    };

    // The device (PCI function or auxiliary device) and the PCI function.
    let device_link = ib_dir.join("device");
    let mut netdevs: Vec<String> = Vec::new();
    match fs::symlink_metadata(&device_link) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            debug!(hca = name, "no device link: software RDMA device");
        }
        Err(error) => {
            warn!(hca = name, path = %device_link.display(), error = %Report(&error), "device link unreadable");
        }
        Ok(_) => match sys.dir(&device_link) {
            Some(dev_dir) => {
                let (bus, pci_fn) = classify_device(sys, name, &dev_dir);
                hca.bus = bus;
                hca.driver = sys.link_basename(&dev_dir, "driver");
                netdevs.extend(sys.list(&dev_dir.join("net"), name));
                if let Some(pci_fn) = pci_fn {
                    hca.vendor = read_pci_id(sys, name, &pci_fn, "vendor");
                    hca.device_id = read_pci_id(sys, name, &pci_fn, "device");
                    hca.numa_node = read_numa(sys, name, &pci_fn);
                }
            }
            None => {
                warn!(hca = name, path = %device_link.display(), "device link dangles: PCI function missing");
                hca.bus = fs::read_link(&device_link)
                    .ok()
                    .and_then(|t| bus_from_link_text(&t))
                    .unwrap_or(Bus::Virtual);
            }
        },
    }

    // Ports.
    let ports_dir = ib_dir.join("ports");
    match sys.dir(&ports_dir) {
        None => warn!(hca = name, path = %ports_dir.display(), "no ports directory"),
        Some(ports_dir) => {
            for entry in sys.list(&ports_dir, name) {
                let Ok(number) = entry.parse::<u32>() else {
                    warn!(hca = name, entry = %entry, "ignoring non-numeric port entry");
                    continue;
                };
                if let Some(port) = read_port(sys, name, &ports_dir.join(&entry), number) {
                    netdevs.extend(port.netdevs.iter().cloned());
                    hca.ports.push(port);
                }
            }
        }
    }
    hca.ports.sort_by_key(|p| p.number);
    netdevs.sort();
    netdevs.dedup();
    hca.netdevs = netdevs;

    // Char devices: uverbs, then umad (and issm for InfiniBand ports) in port order.
    let present = |n: &str| dev_root.join("infiniband").join(n).exists();
    for (_, dev_name) in char_devs.uverbs.get(name).into_iter().flatten() {
        hca.char_devices.push(CharDev {
            kind: CharDevKind::Uverbs,
            name: dev_name.clone(),
            port: None,
            present: present(dev_name),
        });
    }
    for mad in char_devs.mad.get(name).into_iter().flatten() {
        if mad.kind == CharDevKind::Issm {
            let is_ib = hca
                .ports
                .iter()
                .any(|p| p.number == mad.port && p.link_layer == LinkLayer::InfiniBand);
            if !is_ib {
                continue;
            }
        }
        hca.char_devices.push(CharDev {
            kind: mad.kind,
            name: mad.name.clone(),
            port: Some(mad.port),
            present: present(&mad.name),
        });
    }
    hca
}

/// The bus of a resolved device directory, and the PCI function to read ids from.
fn classify_device(sys: &Sysfs, hca: &str, dev_dir: &Path) -> (Bus, Option<PathBuf>) {
    let dev_name = file_name(dev_dir);
    let subsystem = sys.link_basename(dev_dir, "subsystem");
    let kind = match subsystem.as_deref() {
        Some("pci") => NameShape::Pci,
        Some("auxiliary") => NameShape::Auxiliary,
        Some(other) => {
            let shape = name_shape(&dev_name);
            if shape == NameShape::Other {
                warn!(hca, device = %dev_name, subsystem = other, "RDMA device on an unknown bus");
            }
            shape
        }
        None => name_shape(&dev_name),
    };
    match kind {
        NameShape::Pci => (
            Bus::Pci {
                address: dev_name.clone(),
            },
            Some(dev_dir.to_path_buf()),
        ),
        NameShape::Auxiliary => {
            let parent = dev_dir
                .parent()
                .filter(|p| p.starts_with(&sys.root) && *p != sys.root);
            let parent_pci = parent.and_then(|p| {
                let pname = file_name(p);
                let is_pci = match sys.link_basename(p, "subsystem").as_deref() {
                    Some(s) => s == "pci",
                    None => name_shape(&pname) == NameShape::Pci,
                };
                is_pci.then(|| (pname, p.to_path_buf()))
            });
            if parent_pci.is_none() {
                warn!(hca, device = %dev_name, "auxiliary device without a PCI parent");
            }
            let (parent_pci, pci_fn) = parent_pci.unzip();
            (
                Bus::Auxiliary {
                    name: dev_name,
                    parent_pci,
                },
                pci_fn,
            )
        }
        NameShape::Other => (Bus::Virtual, None),
    }
}

/// The bus a dangling link's text names: the device component is the one before
/// `infiniband/<dev>` for a class link, or the last one for a `device` link.
fn bus_from_link_text(target: &Path) -> Option<Bus> {
    let comps: Vec<String> = target
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    let end = match comps.iter().rposition(|c| c == "infiniband") {
        Some(i) => i,
        None => comps.len(),
    };
    let dev = comps.get(end.checked_sub(1)?)?;
    match name_shape(dev) {
        NameShape::Pci => Some(Bus::Pci {
            address: dev.clone(),
        }),
        NameShape::Auxiliary => {
            let parent = end
                .checked_sub(2)
                .and_then(|i| comps.get(i))
                .filter(|p| name_shape(p) == NameShape::Pci)
                .cloned();
            Some(Bus::Auxiliary {
                name: dev.clone(),
                parent_pci: parent,
            })
        }
        NameShape::Other => None,
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum NameShape {
    /// `0000:3b:00.0`
    Pci,
    /// `mlx5_core.sf.2`
    Auxiliary,
    Other,
}

fn name_shape(name: &str) -> NameShape {
    if is_pci_address(name) {
        NameShape::Pci
    } else if is_aux_name(name) {
        NameShape::Auxiliary
    } else {
        NameShape::Other
    }
}

/// `DDDD:BB:DD.F` (domain of 4 or more hex digits).
fn is_pci_address(s: &str) -> bool {
    let hex = |p: &str, n: usize| p.len() == n && p.bytes().all(|b| b.is_ascii_hexdigit());
    let mut parts = s.split(':');
    let (Some(dom), Some(bus), Some(devfn), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return false;
    };
    let Some((dev, func)) = devfn.split_once('.') else {
        return false;
    };
    dom.len() >= 4
        && dom.bytes().all(|b| b.is_ascii_hexdigit())
        && hex(bus, 2)
        && hex(dev, 2)
        && func.len() == 1
        && func.bytes().all(|b| (b'0'..=b'7').contains(&b))
}

/// `<module>.<device>.<id>`, e.g. `mlx5_core.sf.2`, `ice.roce.0`.
fn is_aux_name(s: &str) -> bool {
    let word = |p: &str| {
        !p.is_empty()
            && p.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    };
    let mut parts = s.rsplitn(2, '.');
    let (Some(id), Some(rest)) = (parts.next(), parts.next()) else {
        return false;
    };
    !id.is_empty()
        && id.bytes().all(|b| b.is_ascii_digit())
        && rest
            .split_once('.')
            .is_some_and(|(m, d)| word(m) && word(d))
}

fn read_port(sys: &Sysfs, hca: &str, port_dir: &Path, number: u32) -> Option<Port> {
    let Some(port_dir) = sys.dir(port_dir) else {
        warn!(hca, port = number, path = %port_dir.display(), "port entry is not a directory");
        return None;
    };
    let attr = |name: &str| {
        let value = sys.attr(&port_dir, name, hca);
        if value.is_none() {
            warn!(hca, port = number, attr = name, "port attribute missing");
        }
        value
    };
    let state = attr("state").unwrap_or_default();
    let phys_state = attr("phys_state").unwrap_or_default();
    let link_layer = match attr("link_layer") {
        Some(ll) if !ll.is_empty() => LinkLayer::parse(&ll),
        _ => LinkLayer::Other("unknown".to_string()),
    };
    let mut netdevs = Vec::new();
    if let Some(ndevs) = sys.dir(&port_dir.join("gid_attrs/ndevs")) {
        for gid in sys.list(&ndevs, hca) {
            // Unused GIDs fail to read (EINVAL) or are empty: not a problem.
            if let Some(n) = sys.quiet_attr(&ndevs, &gid) {
                if is_netdev_name(&n) {
                    netdevs.push(n);
                } else if !n.is_empty() {
                    warn!(hca, port = number, gid = %gid, value = %n, "ignoring bad ndevs entry");
                }
            }
        }
    }
    netdevs.sort();
    netdevs.dedup();
    Some(Port {
        number,
        state,
        phys_state,
        link_layer,
        netdevs,
    })
}

/// A plausible interface name (`IFNAMSIZ` - 1, no `/`, no whitespace).
fn is_netdev_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() < 16
        && s.bytes()
            .all(|b| b.is_ascii_graphic() && b != b'/' && b != b':')
}

/// `0x15b3` -> `15b3`; garbage -> `None` with a warning.
fn read_pci_id(sys: &Sysfs, hca: &str, pci_fn: &Path, attr: &str) -> Option<String> {
    let raw = sys.attr(pci_fn, attr, hca)?;
    let id = raw
        .strip_prefix("0x")
        .or_else(|| raw.strip_prefix("0X"))
        .unwrap_or(&raw)
        .to_ascii_lowercase();
    if !id.is_empty() && id.len() <= 8 && id.bytes().all(|b| b.is_ascii_hexdigit()) {
        Some(id)
    } else {
        warn!(hca, attr, value = %raw, "garbage PCI id");
        None
    }
}

/// `numa_node`: `-1` (no NUMA) and garbage are `None`.
fn read_numa(sys: &Sysfs, hca: &str, pci_fn: &Path) -> Option<i64> {
    let raw = sys.attr(pci_fn, "numa_node", hca)?;
    match raw.parse::<i64>() {
        Ok(n) if n >= 0 => Some(n),
        Ok(_) => None,
        Err(_) => {
            warn!(hca, value = %raw, "garbage numa_node");
            None
        }
    }
}

/// The char devices of every RDMA device, from `class/infiniband_verbs` and
/// `class/infiniband_mad`.
#[derive(Debug, Default)]
struct CharDevIndex {
    /// ibdev -> (index, `uverbsN`), sorted by index.
    uverbs: BTreeMap<String, Vec<(u32, String)>>,
    /// ibdev -> umad/issm entries, sorted by (port, kind, index).
    mad: BTreeMap<String, Vec<MadDev>>,
}

#[derive(Debug)]
struct MadDev {
    port: u32,
    order: u8,
    index: u32,
    kind: CharDevKind,
    name: String,
}

impl CharDevIndex {
    fn read(sys: &Sysfs) -> Self {
        let mut idx = Self::default();
        let verbs = sys.root.join("class/infiniband_verbs");
        if let Some(verbs) = sys.dir(&verbs) {
            for name in sys.list(&verbs, "-") {
                let Some(index) = indexed(&name, "uverbs") else {
                    continue;
                };
                let Some(dir) = sys.dir(&verbs.join(&name)) else {
                    warn!(char_dev = %name, "uverbs class entry dangles");
                    continue;
                };
                match sys.attr(&dir, "ibdev", &name) {
                    Some(ibdev) if !ibdev.is_empty() => {
                        idx.uverbs.entry(ibdev).or_default().push((index, name));
                    }
                    _ => warn!(char_dev = %name, "uverbs entry without ibdev"),
                }
            }
        }
        let mad = sys.root.join("class/infiniband_mad");
        if let Some(mad) = sys.dir(&mad) {
            for name in sys.list(&mad, "-") {
                let (kind, order, index) = if let Some(i) = indexed(&name, "umad") {
                    (CharDevKind::Umad, 0, i)
                } else if let Some(i) = indexed(&name, "issm") {
                    (CharDevKind::Issm, 1, i)
                } else {
                    continue;
                };
                let Some(dir) = sys.dir(&mad.join(&name)) else {
                    warn!(char_dev = %name, "MAD class entry dangles");
                    continue;
                };
                let ibdev = sys.attr(&dir, "ibdev", &name).filter(|s| !s.is_empty());
                let port = sys.attr(&dir, "port", &name).map(|p| p.parse::<u32>());
                match (ibdev, port) {
                    (Some(ibdev), Some(Ok(port))) => {
                        idx.mad.entry(ibdev).or_default().push(MadDev {
                            port,
                            order,
                            index,
                            kind,
                            name,
                        });
                    }
                    _ => warn!(char_dev = %name, "MAD entry without a usable ibdev/port"),
                }
            }
        }
        for v in idx.uverbs.values_mut() {
            v.sort();
        }
        for v in idx.mad.values_mut() {
            v.sort_by_key(|m| (m.port, m.order, m.index));
        }
        idx
    }
}

/// `uverbs12` with prefix `uverbs` -> 12.
fn indexed(name: &str, prefix: &str) -> Option<u32> {
    name.strip_prefix(prefix)?.parse().ok()
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Reads confined to a canonical sysfs root.
struct Sysfs {
    root: PathBuf,
}

impl Sysfs {
    /// `path` resolved (links followed) when it is a directory inside the root.
    fn dir(&self, path: &Path) -> Option<PathBuf> {
        let resolved = fs::canonicalize(path).ok()?;
        if !resolved.starts_with(&self.root) {
            warn!(path = %path.display(), target = %resolved.display(), "link leaves the sysfs root; ignored");
            return None;
        }
        resolved.is_dir().then_some(resolved)
    }

    /// Sorted UTF-8 entry names of `dir` (empty when absent or unreadable).
    fn list(&self, dir: &Path, hca: &str) -> Vec<String> {
        let rd = match fs::read_dir(dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Vec::new(),
            Err(error) => {
                warn!(hca, path = %dir.display(), error = %Report(&error), "directory unreadable");
                return Vec::new();
            }
        };
        let mut names: Vec<String> = rd
            .filter_map(Result::ok)
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|n| !n.starts_with('.'))
            .collect();
        names.sort();
        names
    }

    /// The trimmed content of the attribute file `dir/name` (`dir` canonical, `name` one
    /// component and not a link); `None` when absent (quietly) or unreadable (with a
    /// warning).
    fn attr(&self, dir: &Path, name: &str, hca: &str) -> Option<String> {
        match self.read_attr(dir, name) {
            Ok(v) => v,
            Err(error) => {
                warn!(hca, path = %dir.join(name).display(), error = %Report(&error), "attribute unreadable");
                None
            }
        }
    }

    /// Like [`attr`](Self::attr) without the warning.
    fn quiet_attr(&self, dir: &Path, name: &str) -> Option<String> {
        self.read_attr(dir, name).ok().flatten()
    }

    fn read_attr(&self, dir: &Path, name: &str) -> io::Result<Option<String>> {
        let path = dir.join(name);
        let meta = match fs::symlink_metadata(&path) {
            Ok(m) => m,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        if !meta.is_file() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "not a regular file",
            ));
        }
        let bytes = fs::read(&path)?;
        Ok(Some(String::from_utf8_lossy(&bytes).trim().to_string()))
    }

    /// The last component of the link `dir/name` (`driver`, `subsystem`), without following it.
    fn link_basename(&self, dir: &Path, name: &str) -> Option<String> {
        let target = fs::read_link(dir.join(name)).ok()?;
        target.file_name().map(|n| n.to_string_lossy().into_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdma_device_plugin_testkit::fixture::{FixtureTree, HcaSpec, example_two_hca_node};

    fn tree() -> (tempfile::TempDir, FixtureTree) {
        let dir = tempfile::tempdir().unwrap();
        let tree = FixtureTree::new(dir.path().join("node")).unwrap();
        (dir, tree)
    }

    fn discover_tree(tree: &FixtureTree) -> Inventory {
        discover(&tree.sys_root(), &tree.dev_root()).unwrap()
    }

    fn names(hca: &Hca, kind: CharDevKind) -> Vec<&str> {
        hca.char_devices
            .iter()
            .filter(|c| c.kind == kind)
            .map(|c| c.name.as_str())
            .collect()
    }

    #[test]
    fn connectx_infiniband() {
        let (_d, tree) = tree();
        tree.add_hca(HcaSpec::connectx_ib("mlx5_0", "0000:3b:00.0").numa(0))
            .unwrap();
        let inv = discover_tree(&tree);
        assert!(inv.rdma_cm.present);
        assert_eq!(inv.hcas.len(), 1);
        let h = &inv.hcas[0];
        assert_eq!(h.name, "mlx5_0");
        assert_eq!(
            h.bus,
            Bus::Pci {
                address: "0000:3b:00.0".into()
            }
        );
        assert_eq!(h.vendor.as_deref(), Some("15b3"));
        assert_eq!(h.device_id.as_deref(), Some("101b"));
        assert_eq!(h.driver.as_deref(), Some("mlx5_core"));
        assert_eq!(h.numa_node, Some(0));
        assert!(h.netdevs.is_empty());
        assert_eq!(h.ports.len(), 1);
        assert_eq!(h.ports[0].state, "4: ACTIVE");
        assert_eq!(h.ports[0].phys_state, "5: LinkUp");
        assert_eq!(h.ports[0].link_layer, LinkLayer::InfiniBand);
        assert_eq!(names(h, CharDevKind::Uverbs), ["uverbs0"]);
        assert_eq!(names(h, CharDevKind::Umad), ["umad0"]);
        assert_eq!(names(h, CharDevKind::Issm), ["issm0"]);
        assert!(h.char_devices.iter().all(|c| c.present));
        assert_eq!(h.char_devices[1].port, Some(1));
        assert!(h.health.is_healthy(), "{:?}", h.health);
    }

    #[test]
    fn connectx_ethernet_has_no_issm() {
        let (_d, tree) = tree();
        tree.add_hca(HcaSpec::connectx_eth("mlx5_1", "0000:3b:00.1").netdev("ens1f1"))
            .unwrap();
        // The kernel creates issm0 for a RoCE port too; discovery must not hand it out.
        assert!(tree.dev_root().join("infiniband/issm0").exists());
        let inv = discover_tree(&tree);
        let h = inv.hca("mlx5_1").unwrap();
        assert_eq!(h.device_id.as_deref(), Some("101d"));
        assert_eq!(h.ports[0].link_layer, LinkLayer::Ethernet);
        assert_eq!(h.ports[0].netdevs, ["ens1f1"]);
        assert_eq!(h.netdevs, ["ens1f1"]);
        assert_eq!(names(h, CharDevKind::Uverbs), ["uverbs0"]);
        assert_eq!(names(h, CharDevKind::Umad), ["umad0"]);
        assert!(names(h, CharDevKind::Issm).is_empty());
        assert!(!h.has_infiniband_port());
        assert!(h.health.is_healthy(), "{:?}", h.health);
    }

    #[test]
    fn netdev_only_in_gid_attrs_is_found() {
        let (_d, tree) = tree();
        tree.add_hca(HcaSpec::connectx_eth("mlx5_1", "0000:3b:00.1").netdev("ens1f1"))
            .unwrap();
        tree.remove_sys("class/net/ens1f1").unwrap();
        tree.remove_sys("bus/pci/devices/0000:3b:00.1/net").unwrap();
        let inv = discover_tree(&tree);
        assert_eq!(inv.hcas[0].netdevs, ["ens1f1"]);
    }

    #[test]
    fn two_hcas_on_two_numa_nodes() {
        let (_d, tree) = tree();
        // Added out of order: the inventory is sorted by name.
        tree.add_hca(
            HcaSpec::connectx_eth("mlx5_1", "0000:af:00.0")
                .numa(1)
                .netdev("ens2f0np0"),
        )
        .unwrap();
        tree.add_hca(HcaSpec::connectx_ib("mlx5_0", "0000:3b:00.0").numa(0))
            .unwrap();
        let inv = discover_tree(&tree);
        let got: Vec<_> = inv
            .hcas
            .iter()
            .map(|h| (h.name.as_str(), h.numa_node))
            .collect();
        assert_eq!(got, [("mlx5_0", Some(0)), ("mlx5_1", Some(1))]);
        // Indexes were allocated in insertion order.
        assert_eq!(names(&inv.hcas[0], CharDevKind::Uverbs), ["uverbs1"]);
        assert_eq!(names(&inv.hcas[1], CharDevKind::Uverbs), ["uverbs0"]);
        assert!(inv.hcas.iter().all(|h| h.health.is_healthy()));
    }

    #[test]
    fn no_numa_is_none() {
        let (_d, tree) = tree();
        tree.add_hca(HcaSpec::connectx_ib("mlx5_0", "0000:3b:00.0").numa(-1))
            .unwrap();
        assert_eq!(discover_tree(&tree).hcas[0].numa_node, None);
    }

    #[test]
    fn sub_function_on_the_auxiliary_bus() {
        let (_d, tree) = tree();
        tree.add_hca(
            HcaSpec::connectx_eth("mlx5_0", "0000:3b:00.0")
                .numa(1)
                .netdev("ens1f0np0"),
        )
        .unwrap();
        tree.add_hca(HcaSpec::sf("mlx5_4", "mlx5_core.sf.2", "0000:3b:00.0").netdev("enp59s0f0s2"))
            .unwrap();
        let inv = discover_tree(&tree);
        let sf = inv.hca("mlx5_4").unwrap();
        assert_eq!(
            sf.bus,
            Bus::Auxiliary {
                name: "mlx5_core.sf.2".into(),
                parent_pci: Some("0000:3b:00.0".into())
            }
        );
        assert_eq!(sf.pci_address(), Some("0000:3b:00.0"));
        assert_eq!(sf.vendor.as_deref(), Some("15b3"));
        assert_eq!(sf.device_id.as_deref(), Some("101d"));
        assert_eq!(sf.numa_node, Some(1));
        assert_eq!(sf.driver.as_deref(), Some("mlx5_core.sf"));
        // Its own netdev, not the PF's.
        assert_eq!(sf.netdevs, ["enp59s0f0s2"]);
        assert_eq!(names(sf, CharDevKind::Uverbs), ["uverbs1"]);
        assert!(sf.health.is_healthy(), "{:?}", sf.health);
        let pf = inv.hca("mlx5_0").unwrap();
        assert_eq!(pf.netdevs, ["ens1f0np0"]);
    }

    #[test]
    fn intel_irdma() {
        let (_d, tree) = tree();
        tree.add_hca(
            HcaSpec::irdma("rocep94s0f0", "0000:5e:00.0")
                .numa(0)
                .netdev("ens785f0"),
        )
        .unwrap();
        tree.add_hca(HcaSpec::irdma("iwp94s0f1", "0000:5e:00.1").iwarp())
            .unwrap();
        let inv = discover_tree(&tree);
        let roce = inv.hca("rocep94s0f0").unwrap();
        assert_eq!(roce.vendor.as_deref(), Some("8086"));
        assert_eq!(roce.device_id.as_deref(), Some("1593"));
        assert_eq!(roce.driver.as_deref(), Some("ice"));
        assert_eq!(roce.link_layers(), [LinkLayer::Ethernet]);
        assert_eq!(roce.netdevs, ["ens785f0"]);
        assert_eq!(names(roce, CharDevKind::Umad), ["umad0"]);
        assert!(names(roce, CharDevKind::Issm).is_empty());
        assert!(roce.health.is_healthy(), "{:?}", roce.health);
        let iw = inv.hca("iwp94s0f1").unwrap();
        assert_eq!(names(iw, CharDevKind::Uverbs), ["uverbs1"]);
        assert!(names(iw, CharDevKind::Umad).is_empty());
        assert!(iw.health.is_healthy(), "{:?}", iw.health);
    }

    #[test]
    fn driver_not_loaded_is_empty() {
        let (_d, tree) = tree();
        let inv = discover_tree(&tree);
        assert!(inv.hcas.is_empty());
        assert!(!inv.rdma_cm.present);
        // The card is there, its driver is not: still nothing.
        tree.add_pci_function(HcaSpec::connectx_ib("mlx5_0", "0000:3b:00.0"))
            .unwrap();
        assert!(discover_tree(&tree).hcas.is_empty());
        // The driver loads.
        tree.add_hca(HcaSpec::connectx_ib("mlx5_0", "0000:3b:00.0"))
            .unwrap();
        let inv = discover_tree(&tree);
        assert_eq!(inv.hcas.len(), 1);
        assert!(inv.hcas[0].health.is_healthy(), "{:?}", inv.hcas[0].health);
    }

    #[test]
    fn port_down_then_up() {
        let (_d, tree) = tree();
        tree.add_hca(HcaSpec::connectx_ib("mlx5_0", "0000:3b:00.0"))
            .unwrap();
        tree.set_port_state("mlx5_0", 1, "DOWN", "Polling").unwrap();
        let h = discover_tree(&tree).hcas.remove(0);
        assert_eq!(
            h.health.reasons,
            ["port 1 state DOWN", "port 1 phys_state Polling"]
        );
        assert_eq!(h.health.kubelet_str(), "Unhealthy");
        tree.set_port_state("mlx5_0", 1, "ACTIVE", "LinkUp")
            .unwrap();
        let h = discover_tree(&tree).hcas.remove(0);
        assert!(h.health.is_healthy(), "{:?}", h.health);
    }

    #[test]
    fn dual_port_with_one_port_down_stays_healthy() {
        let (_d, tree) = tree();
        tree.add_hca(
            HcaSpec::connectx_ib("mlx5_0", "0000:3b:00.0")
                .ports(2)
                .port_state(2, "DOWN", "Disabled"),
        )
        .unwrap();
        let h = discover_tree(&tree).hcas.remove(0);
        assert_eq!(h.ports.len(), 2);
        assert_eq!(names(&h, CharDevKind::Umad), ["umad0", "umad1"]);
        assert_eq!(names(&h, CharDevKind::Issm), ["issm0", "issm1"]);
        assert!(h.health.is_healthy(), "{:?}", h.health);
        tree.set_port_state("mlx5_0", 1, "INIT", "LinkUp").unwrap();
        let h = discover_tree(&tree).hcas.remove(0);
        assert_eq!(
            h.health.reasons,
            [
                "port 1 state INIT",
                "port 2 state DOWN",
                "port 2 phys_state Disabled"
            ]
        );
    }

    #[test]
    fn missing_char_device_is_unhealthy_but_listed() {
        let (_d, tree) = tree();
        tree.add_hca(HcaSpec::connectx_ib("mlx5_0", "0000:3b:00.0"))
            .unwrap();
        tree.remove_char_dev("uverbs0").unwrap();
        let inv = discover_tree(&tree);
        let h = &inv.hcas[0];
        let uverbs = &h.char_devices[0];
        assert_eq!((uverbs.name.as_str(), uverbs.present), ("uverbs0", false));
        assert_eq!(h.health.reasons, ["char device uverbs0 missing"]);
        tree.add_char_dev("uverbs0").unwrap();
        tree.remove_rdma_cm().unwrap();
        let inv = discover_tree(&tree);
        assert!(!inv.rdma_cm.present);
        assert_eq!(inv.hcas[0].health.reasons, ["rdma_cm missing"]);
    }

    #[test]
    fn hot_removal() {
        let (_d, tree) = tree();
        tree.add_hca(HcaSpec::connectx_ib("mlx5_0", "0000:3b:00.0"))
            .unwrap();
        tree.add_hca(HcaSpec::connectx_ib("mlx5_1", "0000:3b:00.1"))
            .unwrap();
        tree.remove_hca("mlx5_0").unwrap();
        let inv = discover_tree(&tree);
        assert_eq!(inv.hcas.len(), 1);
        assert_eq!(inv.hcas[0].name, "mlx5_1");
        assert!(inv.hcas[0].health.is_healthy());
    }

    #[test]
    fn hot_removal_of_a_pf_takes_its_sub_function() {
        let dir = tempfile::tempdir().unwrap();
        let tree = example_two_hca_node(dir.path()).unwrap();
        tree.remove_hca("mlx5_1").unwrap();
        let inv = discover_tree(&tree);
        let names: Vec<_> = inv.hcas.iter().map(|h| h.name.as_str()).collect();
        assert_eq!(names, ["mlx5_0"]);
        assert!(!tree.dev_root().join("infiniband/uverbs2").exists());
    }

    #[test]
    fn dangling_pci_function() {
        let (_d, tree) = tree();
        tree.add_hca(HcaSpec::connectx_ib("mlx5_0", "0000:3b:00.0"))
            .unwrap();
        tree.add_hca(HcaSpec::connectx_ib("mlx5_1", "0000:5e:00.0"))
            .unwrap();
        tree.remove_pci_function("0000:3b:00.0").unwrap();
        let inv = discover_tree(&tree);
        assert_eq!(inv.hcas.len(), 2);
        let h = inv.hca("mlx5_0").unwrap();
        assert_eq!(
            h.bus,
            Bus::Pci {
                address: "0000:3b:00.0".into()
            }
        );
        assert!(!h.health.is_healthy());
        assert_eq!(h.health.reasons[0], "PCI function missing");
        assert!(inv.hca("mlx5_1").unwrap().health.is_healthy());
    }

    #[test]
    fn dangling_device_link() {
        // The RDMA device directory is still there, its `device` link dangles.
        let (_d, tree) = tree();
        tree.add_hca(HcaSpec::connectx_ib("mlx5_0", "0000:3b:00.0"))
            .unwrap();
        let ib = tree.ib_dir("mlx5_0").unwrap();
        fs::remove_file(ib.join("device")).unwrap();
        std::os::unix::fs::symlink("../../../0000:3b:00.7", ib.join("device")).unwrap();
        let inv = discover_tree(&tree);
        let h = &inv.hcas[0];
        assert_eq!(
            h.bus,
            Bus::Pci {
                address: "0000:3b:00.7".into()
            }
        );
        assert_eq!(h.health.reasons, ["PCI function missing"]);
        assert_eq!(h.ports.len(), 1);
    }

    #[test]
    fn dangling_sf_link() {
        let dir = tempfile::tempdir().unwrap();
        let tree = example_two_hca_node(dir.path()).unwrap();
        let aux = tree.device_dir("mlx5_2").unwrap();
        fs::remove_dir_all(aux).unwrap();
        let inv = discover_tree(&tree);
        let sf = inv.hca("mlx5_2").unwrap();
        assert_eq!(
            sf.bus,
            Bus::Auxiliary {
                name: "mlx5_core.sf.2".into(),
                parent_pci: Some("0000:af:00.0".into())
            }
        );
        assert!(
            sf.health
                .reasons
                .contains(&"PCI function missing".to_string()),
            "{:?}",
            sf.health
        );
    }

    #[test]
    fn link_leaving_the_root_is_not_followed() {
        let (d, tree) = tree();
        tree.add_hca(HcaSpec::connectx_ib("mlx5_0", "0000:3b:00.0"))
            .unwrap();
        let outside = d.path().join("outside/0000:3b:00.0");
        fs::create_dir_all(&outside).unwrap();
        fs::write(outside.join("vendor"), "0x15b3\n").unwrap();
        let ib = tree.ib_dir("mlx5_0").unwrap();
        fs::remove_file(ib.join("device")).unwrap();
        std::os::unix::fs::symlink(&outside, ib.join("device")).unwrap();
        let inv = discover_tree(&tree);
        assert_eq!(inv.hcas[0].vendor, None);
        assert_eq!(inv.hcas[0].health.reasons, ["PCI function missing"]);
    }

    #[test]
    fn garbage_does_not_panic() {
        let (_d, tree) = tree();
        tree.add_hca(HcaSpec::connectx_eth("mlx5_0", "0000:3b:00.0").netdev("ens1f0"))
            .unwrap();
        tree.add_hca(HcaSpec::connectx_ib("mlx5_1", "0000:3b:00.1"))
            .unwrap();
        let f = "devices/pci0000:00/0000:00:02.0/0000:3b:00.0";
        let ib = format!("{f}/infiniband/mlx5_0");
        tree.write_sys(format!("{f}/vendor"), "\u{fffd}\u{0}zz\n")
            .unwrap();
        tree.write_sys(format!("{f}/numa_node"), "lots\n").unwrap();
        tree.write_sys(format!("{ib}/ports/1/state"), "\u{1}\u{2}\n")
            .unwrap();
        tree.remove_sys(format!("{ib}/ports/1/link_layer")).unwrap();
        tree.write_sys(format!("{ib}/ports/1/gid_attrs/ndevs/0"), "a/b c\n")
            .unwrap();
        tree.write_sys(format!("{ib}/ports/banana/state"), "4: ACTIVE\n")
            .unwrap();
        // A port that is a file, not a directory.
        tree.write_sys(format!("{ib}/ports/2"), "x").unwrap();
        tree.write_sys("class/infiniband_verbs/uverbs0/ibdev", "")
            .unwrap();
        tree.write_sys("class/infiniband_mad/umad0/port", "one\n")
            .unwrap();
        // A class entry that is a plain file, and one that dangles into nowhere.
        tree.write_sys("class/infiniband/junk", "x").unwrap();
        std::os::unix::fs::symlink("nowhere", tree.sys_root().join("class/infiniband/ghost"))
            .unwrap();
        // mlx5_1: no ports at all.
        tree.remove_sys("devices/pci0000:00/0000:00:02.0/0000:3b:00.1/infiniband/mlx5_1/ports")
            .unwrap();

        let inv = discover_tree(&tree);
        let names: Vec<_> = inv.hcas.iter().map(|h| h.name.as_str()).collect();
        assert_eq!(names, ["ghost", "junk", "mlx5_0", "mlx5_1"]);
        let h = inv.hca("mlx5_0").unwrap();
        assert_eq!(h.vendor, None);
        assert_eq!(h.device_id.as_deref(), Some("101d"));
        assert_eq!(h.numa_node, None);
        assert_eq!(h.ports.len(), 1);
        assert_eq!(h.ports[0].link_layer, LinkLayer::Other("unknown".into()));
        assert_eq!(
            h.ports[0].netdevs,
            ["ens1f0"],
            "the good GID entry still counts"
        );
        assert!(names_of(h).iter().all(|n| !n.starts_with("uverbs")));
        assert!(!h.health.is_healthy());
        assert!(h.health.reasons.contains(&"no uverbs device".to_string()));
        let h1 = inv.hca("mlx5_1").unwrap();
        assert_eq!(h1.health.reasons, ["no ports"]);
        let junk = inv.hca("junk").unwrap();
        assert_eq!(junk.bus, Bus::Virtual);
        assert!(!junk.health.is_healthy());
        // Serialises without trouble.
        serde_json::to_string(&inv).unwrap();
    }

    fn names_of(h: &Hca) -> Vec<&str> {
        h.char_devices.iter().map(|c| c.name.as_str()).collect()
    }

    #[test]
    fn driver_unbound() {
        let (_d, tree) = tree();
        tree.add_hca(HcaSpec::connectx_ib("mlx5_0", "0000:3b:00.0"))
            .unwrap();
        tree.unbind_driver("mlx5_0").unwrap();
        let h = discover_tree(&tree).hcas.remove(0);
        assert_eq!(h.driver, None);
        assert_eq!(h.health.reasons, ["driver not bound"]);
        tree.bind_driver("mlx5_0", "mlx5_core").unwrap();
        let h = discover_tree(&tree).hcas.remove(0);
        assert_eq!(h.driver.as_deref(), Some("mlx5_core"));
        assert!(h.health.is_healthy());
    }

    #[test]
    fn example_node() {
        let dir = tempfile::tempdir().unwrap();
        let tree = example_two_hca_node(dir.path()).unwrap();
        let inv = discover_tree(&tree);
        let got: Vec<_> = inv
            .hcas
            .iter()
            .map(|h| (h.name.as_str(), h.numa_node, h.health.is_healthy()))
            .collect();
        assert_eq!(
            got,
            [
                ("mlx5_0", Some(0), true),
                ("mlx5_1", Some(1), true),
                ("mlx5_2", Some(1), true)
            ]
        );
        assert_eq!(inv.hca("mlx5_1").unwrap().netdevs, ["ens2f0np0"]);
    }

    #[test]
    fn unreadable_roots_are_errors() {
        let (d, tree) = tree();
        let missing = d.path().join("nope");
        assert!(matches!(
            discover(&missing, &tree.dev_root()),
            Err(DiscoveryError::SysRoot { .. })
        ));
        assert!(matches!(
            discover(&tree.sys_root(), &missing),
            Err(DiscoveryError::DevRoot { .. })
        ));
    }

    #[test]
    fn name_shapes() {
        assert!(is_pci_address("0000:3b:00.0"));
        assert!(is_pci_address("10000:af:1f.7"));
        assert!(!is_pci_address("0000:3b:00.8"));
        assert!(!is_pci_address("mlx5_core.sf.2"));
        assert!(is_aux_name("mlx5_core.sf.2"));
        assert!(is_aux_name("ice.roce.0"));
        assert!(!is_aux_name("mlx5_core.sf"));
        assert!(!is_aux_name("0000:3b:00.0"));
        assert_eq!(
            bus_from_link_text(Path::new(
                "../../devices/pci0000:00/0000:00:02.0/0000:af:00.0/mlx5_core.sf.2/infiniband/mlx5_2"
            )),
            Some(Bus::Auxiliary {
                name: "mlx5_core.sf.2".into(),
                parent_pci: Some("0000:af:00.0".into())
            })
        );
        assert_eq!(
            bus_from_link_text(Path::new("../../devices/virtual/infiniband/rxe0")),
            None
        );
    }

    #[test]
    fn the_netns_mode_comes_from_ib_core() {
        let (_d, tree) = tree();
        tree.add_hca(HcaSpec::connectx_ib("mlx5_0", "0000:3b:00.0"))
            .unwrap();
        assert_eq!(discover_tree(&tree).netns_mode, NetnsMode::Unknown);
        tree.write_sys(crate::inventory::netns_mode::PARAM, "N\n")
            .unwrap();
        let inv = discover_tree(&tree);
        assert_eq!(inv.netns_mode, NetnsMode::Exclusive);
        assert!(
            inv.hcas[0].health.is_healthy(),
            "the mode is reported, not judged"
        );
        tree.write_sys(crate::inventory::netns_mode::PARAM, "Y\n")
            .unwrap();
        assert_eq!(discover_tree(&tree).netns_mode, NetnsMode::Shared);
    }
}
