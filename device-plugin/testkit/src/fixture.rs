//! Fake sysfs and dev trees in the kernel's layout, for tests, benchmarks and examples.
//!
//! [`FixtureTree`] writes below a root directory the caller owns (a tempdir in tests, a
//! checked-in folder for `examples/sysfs`):
//!
//! ```text
//! <root>/sys/devices/pci0000:00/0000:00:02.0/<bdf>/{vendor,device,class,numa_node}
//! <root>/sys/devices/.../<bdf>/subsystem -> ../../../../bus/pci
//! <root>/sys/devices/.../<bdf>/driver -> ../../../../bus/pci/drivers/mlx5_core
//! <root>/sys/devices/.../<bdf>/net/<ifname>/{type,operstate,address,device}
//! <root>/sys/devices/.../<bdf>/infiniband/<dev>/{device,subsystem,node_type,node_guid,..}
//! <root>/sys/devices/.../<bdf>/infiniband/<dev>/ports/<n>/{state,phys_state,link_layer}
//! <root>/sys/devices/.../<bdf>/infiniband/<dev>/ports/<n>/gid_attrs/{ndevs,types}/<i>
//! <root>/sys/devices/.../<bdf>/infiniband_verbs/uverbsN/{ibdev,dev,abi_version,device,subsystem}
//! <root>/sys/devices/.../<bdf>/infiniband_mad/{umadN,issmN}/{ibdev,port,dev,device,subsystem}
//! <root>/sys/devices/.../<bdf>/mlx5_core.sf.N/...   (a sub-function: the same below it)
//! <root>/sys/bus/pci/devices/<bdf> -> ../../../devices/.../<bdf>
//! <root>/sys/bus/pci/drivers/<driver>/<bdf> -> ../../../../devices/.../<bdf>
//! <root>/sys/bus/auxiliary/devices/mlx5_core.sf.N -> ../../../devices/.../<bdf>/mlx5_core.sf.N
//! <root>/sys/class/infiniband/<dev> -> ../../devices/.../infiniband/<dev>
//! <root>/sys/class/infiniband_verbs/{abi_version,uverbsN -> ..}
//! <root>/sys/class/infiniband_mad/{abi_version,umadN -> ..,issmN -> ..}
//! <root>/sys/class/net/<ifname> -> ../../devices/.../net/<ifname>
//! <root>/dev/infiniband/{rdma_cm,uverbsN,umadN,issmN}   (plain empty files: tests can't mknod)
//! ```
//!
//! Every link is relative, as the kernel's are, so a tree can be copied or checked in.
//! Like the kernel, each port with a MAD agent (InfiniBand and RoCE, not iWARP) gets a `umadN`
//! and an `issmN` with the same `N`; it is discovery that hands `issm` out only for InfiniBand
//! ports. Indexes are the lowest free ones (the kernel's IDA), found by scanning the tree, so
//! they are deterministic and a re-added HCA reuses a freed index.
//!
//! State files are written atomically (temp file plus rename) because a watcher may poll them
//! while a test flips them.
//!
//! It knows the kernel's layout, not the plugin's types: link layers and parameter paths are the
//! kernel's words ([`LinkLayer`], [`NETNS_MODE_PARAM`]).

use std::{
    borrow::Borrow,
    collections::BTreeSet,
    fs, io,
    os::unix::fs::symlink,
    path::{Component, Path, PathBuf},
};

use rdma_streams_common::atomic_file;

/// ib_core's RDMA network-namespace mode parameter, below `sys` (the plugin's
/// `netns_mode::PARAM`): `Y` shared, `N` exclusive.
pub const NETNS_MODE_PARAM: &str = "module/ib_core/parameters/netns_mode";

/// How a port carries RDMA: the kernel's `ports/<n>/link_layer` words.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkLayer {
    InfiniBand,
    /// RoCE (and iWARP).
    Ethernet,
}

impl LinkLayer {
    /// The kernel's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InfiniBand => "InfiniBand",
            Self::Ethernet => "Ethernet",
        }
    }
}

/// The PCI bridge every fixture PCI function hangs off, below `sys/devices`.
const DEFAULT_PCI_PARENT: &str = "pci0000:00/0000:00:02.0";
/// Char device major of the RDMA char devices (`uverbs`, `umad`, `issm`).
const IB_MAJOR: u32 = 231;
/// Minor base of `uverbsN` (`umadN` starts at 0, `issmN` at 64).
const UVERBS_MINOR_BASE: u32 = 192;
const ISSM_MINOR_BASE: u32 = 64;

/// Where an HCA's hardware lives.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Location {
    /// Its own PCI function.
    Pci {
        address: String,
        vendor: String,
        device_id: String,
        class: String,
        numa_node: i64,
    },
    /// A Mellanox sub-function: an auxiliary device below an existing PCI function.
    Sf {
        aux_name: String,
        parent_pci: String,
    },
}

/// What to build for one RDMA device. Start from a constructor
/// ([`connectx_ib`](Self::connectx_ib), [`connectx_eth`](Self::connectx_eth),
/// [`sf`](Self::sf), [`irdma`](Self::irdma)) and adjust with the chained setters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HcaSpec {
    name: String,
    location: Location,
    driver: Option<String>,
    ports: u32,
    link_layer: LinkLayer,
    netdevs: Vec<String>,
    uverbs_index: Option<u32>,
    mad: bool,
    port_states: Vec<(u32, String, String)>,
    hca_type: String,
    fw_ver: String,
    board_id: String,
}

impl HcaSpec {
    fn pci(name: &str, bdf: &str, vendor: &str, device_id: &str, class: &str) -> Self {
        Self {
            name: name.to_string(),
            location: Location::Pci {
                address: bdf.to_string(),
                vendor: vendor.to_string(),
                device_id: device_id.to_string(),
                class: class.to_string(),
                numa_node: 0,
            },
            driver: Some("mlx5_core".to_string()),
            ports: 1,
            link_layer: LinkLayer::InfiniBand,
            netdevs: Vec::new(),
            uverbs_index: None,
            mad: true,
            port_states: Vec::new(),
            hca_type: String::new(),
            fw_ver: String::new(),
            board_id: String::new(),
        }
    }

    /// A ConnectX-6 (`15b3:101b`, `mlx5_core`) in InfiniBand mode: one port, NUMA node 0, no
    /// netdev (add an IPoIB one with [`netdev`](Self::netdev)).
    pub fn connectx_ib(name: &str, bdf: &str) -> Self {
        Self {
            hca_type: "MT4123".to_string(),
            fw_ver: "20.39.1002".to_string(),
            board_id: "MT_0000000222".to_string(),
            ..Self::pci(name, bdf, "15b3", "101b", "0x020700")
        }
    }

    /// A ConnectX-6 Dx (`15b3:101d`, `mlx5_core`) in Ethernet mode (RoCE): one port, NUMA
    /// node 0. Give it its netdev with [`netdev`](Self::netdev).
    pub fn connectx_eth(name: &str, bdf: &str) -> Self {
        Self {
            link_layer: LinkLayer::Ethernet,
            hca_type: "MT4125".to_string(),
            fw_ver: "22.39.1002".to_string(),
            board_id: "MT_0000000359".to_string(),
            ..Self::pci(name, bdf, "15b3", "101d", "0x020000")
        }
    }

    /// A Mellanox sub-function: the auxiliary device `aux_name` (`mlx5_core.sf.2`, bound to
    /// `mlx5_core.sf`) below the PCI function `parent_bdf`, which must already be in the tree
    /// (add its PF first). Ethernet (RoCE), one port. Vendor, device id and NUMA node are the
    /// parent's; [`numa`](Self::numa) has no effect on it.
    pub fn sf(name: &str, aux_name: &str, parent_bdf: &str) -> Self {
        Self {
            location: Location::Sf {
                aux_name: aux_name.to_string(),
                parent_pci: parent_bdf.to_string(),
            },
            driver: Some("mlx5_core.sf".to_string()),
            ..Self::connectx_eth(name, parent_bdf)
        }
    }

    /// An Intel E810 (`8086:1593`, PCI driver `ice`, RDMA by `irdma`) in RoCEv2 mode: one
    /// Ethernet port, NUMA node 0. [`iwarp`](Self::iwarp) switches it to iWARP (no umad).
    pub fn irdma(name: &str, bdf: &str) -> Self {
        Self {
            driver: Some("ice".to_string()),
            link_layer: LinkLayer::Ethernet,
            hca_type: "E810".to_string(),
            fw_ver: "1.7.1".to_string(),
            board_id: String::new(),
            ..Self::pci(name, bdf, "8086", "1593", "0x020000")
        }
    }

    /// The RDMA device name (`mlx5_0`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The PCI function the hardware lives on (the parent's for a sub-function).
    pub fn pci_address(&self) -> &str {
        match &self.location {
            Location::Pci { address, .. } => address,
            Location::Sf { parent_pci, .. } => parent_pci,
        }
    }

    /// The NUMA node written to the PCI function's `numa_node` (`-1` = none). Ignored for a
    /// sub-function.
    pub fn numa(mut self, node: i64) -> Self {
        if let Location::Pci { numa_node, .. } = &mut self.location {
            *numa_node = node;
        }
        self
    }

    /// Adds a netdev: `net/<name>` of the function (of the auxiliary device for an SF), and
    /// the `gid_attrs/ndevs` of Ethernet ports (port `n` gets the `n`-th netdev, or the last).
    pub fn netdev(mut self, name: &str) -> Self {
        self.netdevs.push(name.to_string());
        self
    }

    /// The number of ports (1 by default).
    pub fn ports(mut self, n: u32) -> Self {
        self.ports = n;
        self
    }

    /// The link layer of every port.
    pub fn link_layer(mut self, link_layer: LinkLayer) -> Self {
        self.link_layer = link_layer;
        self
    }

    /// Uses `uverbs<n>` instead of the lowest free index.
    pub fn uverbs_index(mut self, n: u32) -> Self {
        self.uverbs_index = Some(n);
        self
    }

    /// iWARP: no MAD agent, so no `umad`/`issm` for its ports.
    pub fn iwarp(mut self) -> Self {
        self.mad = false;
        self
    }

    /// The bound driver (`None`: the function is there but unbound).
    pub fn driver(mut self, driver: Option<&str>) -> Self {
        self.driver = driver.map(str::to_string);
        self
    }

    /// The PCI vendor id, without `0x` (ignored for a sub-function).
    pub fn vendor(mut self, id: &str) -> Self {
        if let Location::Pci { vendor, .. } = &mut self.location {
            *vendor = id.to_string();
        }
        self
    }

    /// The PCI device id, without `0x` (ignored for a sub-function).
    pub fn device_id(mut self, id: &str) -> Self {
        if let Location::Pci { device_id, .. } = &mut self.location {
            *device_id = id.to_string();
        }
        self
    }

    /// The initial `state` and `phys_state` of one port (both default to `ACTIVE` and
    /// `LinkUp`); words are expanded like [`FixtureTree::set_port_state`] does.
    pub fn port_state(mut self, port: u32, state: &str, phys_state: &str) -> Self {
        self.port_states.retain(|(p, _, _)| *p != port);
        self.port_states
            .push((port, state.to_string(), phys_state.to_string()));
        self
    }

    fn initial_state(&self, port: u32) -> (String, String) {
        self.port_states
            .iter()
            .find(|(p, _, _)| *p == port)
            .map_or_else(
                || (kernel_state("ACTIVE"), kernel_phys_state("LinkUp")),
                |(_, s, ps)| (kernel_state(s), kernel_phys_state(ps)),
            )
    }
}

/// The char device names [`FixtureTree::add_hca`] allocated.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HcaNodes {
    /// `uverbsN`.
    pub uverbs: String,
    /// `umadN`, one per port in port order (empty for iWARP).
    pub umad: Vec<String>,
    /// `issmN`, one per port in port order (empty for iWARP).
    pub issm: Vec<String>,
}

/// `ACTIVE` -> `4: ACTIVE`, as the kernel writes `ports/<n>/state`. Text that already has a
/// `N:` prefix, or an unknown word, is kept verbatim (so tests can write garbage).
pub fn kernel_state(word: &str) -> String {
    const STATES: [&str; 6] = ["NOP", "DOWN", "INIT", "ARMED", "ACTIVE", "ACTIVE_DEFER"];
    numbered(word, &STATES, 0)
}

/// `LinkUp` -> `5: LinkUp`, as the kernel writes `ports/<n>/phys_state`. Like
/// [`kernel_state`], prefixed or unknown text is kept verbatim.
pub fn kernel_phys_state(word: &str) -> String {
    const STATES: [&str; 7] = [
        "Sleep",
        "Polling",
        "Disabled",
        "PortConfigurationTraining",
        "LinkUp",
        "LinkErrorRecovery",
        "Phy Test",
    ];
    numbered(word, &STATES, 1)
}

fn numbered(word: &str, names: &[&str], first: usize) -> String {
    match names.iter().position(|n| *n == word) {
        Some(i) => format!("{}: {word}", i + first),
        None => word.to_string(),
    }
}

/// A fake node: `<root>/sys` and `<root>/dev`.
#[derive(Clone, Debug)]
pub struct FixtureTree {
    root: PathBuf,
}

impl FixtureTree {
    /// Creates `root/sys` and `root/dev` (and `root` itself). Nothing else: with no HCA added
    /// this is a node whose RDMA driver is not loaded yet (no `class/infiniband`). An existing
    /// tree is reused as it is.
    pub fn new(root: impl AsRef<Path>) -> io::Result<Self> {
        let root = root.as_ref();
        fs::create_dir_all(root.join("sys"))?;
        fs::create_dir_all(root.join("dev"))?;
        // Links are computed lexically: the root must have no `..` nor symlink in it.
        Ok(Self {
            root: fs::canonicalize(root)?,
        })
    }

    /// The directory holding `sys` and `dev` (canonicalized).
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The fake `/sys`.
    pub fn sys_root(&self) -> PathBuf {
        self.root.join("sys")
    }

    /// The fake `/dev`.
    pub fn dev_root(&self) -> PathBuf {
        self.root.join("dev")
    }

    /// `sys/devices/pci0000:00/0000:00:02.0/<bdf>`, or wherever `bus/pci/devices/<bdf>` points.
    pub fn pci_function_dir(&self, bdf: &str) -> PathBuf {
        let bus_link = self.sys_root().join("bus/pci/devices").join(bdf);
        match fs::read_link(&bus_link) {
            Ok(target) => lexical_join(&self.sys_root().join("bus/pci/devices"), &target),
            Err(_) => {
                let domain = bdf.split(':').next().unwrap_or("0000");
                let parent = DEFAULT_PCI_PARENT.replace("0000", domain);
                self.sys_root().join("devices").join(parent).join(bdf)
            }
        }
    }

    /// The directory of the RDMA device (`.../infiniband/<dev>`), from its class link.
    pub fn ib_dir(&self, dev: &str) -> io::Result<PathBuf> {
        let class = self.sys_root().join("class/infiniband");
        let target = fs::read_link(class.join(dev))?;
        Ok(lexical_join(&class, &target))
    }

    /// The device the RDMA device's `device` link names: its PCI function, or its auxiliary
    /// device for a sub-function.
    pub fn device_dir(&self, dev: &str) -> io::Result<PathBuf> {
        let ib = self.ib_dir(dev)?;
        ib.parent()
            .and_then(Path::parent)
            .map(Path::to_path_buf)
            .ok_or_else(|| invalid(format!("{} has no device above it", ib.display())))
    }

    /// Writes the card's PCI function with no driver bound and no RDMA device: what a node
    /// shows before the driver (container) loads. [`add_hca`](Self::add_hca) with the same
    /// spec then "loads the driver". Errors for a sub-function spec.
    pub fn add_pci_function(&self, spec: impl Borrow<HcaSpec>) -> io::Result<PathBuf> {
        let spec = spec.borrow();
        let Location::Pci {
            address,
            vendor,
            device_id,
            class,
            numa_node,
        } = &spec.location
        else {
            return Err(invalid(format!(
                "{} is a sub-function: it has no PCI function of its own",
                spec.name
            )));
        };
        let fn_dir = self.pci_function_dir(address);
        fs::create_dir_all(&fn_dir)?;
        write_atomic(&fn_dir.join("vendor"), &format!("0x{vendor}\n"))?;
        write_atomic(&fn_dir.join("device"), &format!("0x{device_id}\n"))?;
        write_atomic(&fn_dir.join("class"), &format!("{class}\n"))?;
        write_atomic(&fn_dir.join("numa_node"), &format!("{numa_node}\n"))?;
        self.link(&fn_dir.join("subsystem"), &self.sys_root().join("bus/pci"))?;
        self.link(
            &self.sys_root().join("bus/pci/devices").join(address),
            &fn_dir,
        )?;
        Ok(fn_dir)
    }

    /// Adds an RDMA device as a loaded driver stack shows it: the PCI function (or, for a
    /// sub-function, the auxiliary device below its existing parent), the bound driver, the
    /// netdevs, the `class/infiniband` entry with its ports, `uverbsN`, `umadN`/`issmN` per
    /// port, the class links, the nodes under `dev/infiniband/` and `rdma_cm` if absent.
    pub fn add_hca(&self, spec: impl Borrow<HcaSpec>) -> io::Result<HcaNodes> {
        let spec = spec.borrow();
        let sys = self.sys_root();
        let (dev_dir, bus) = match &spec.location {
            Location::Pci { .. } => (self.add_pci_function(spec)?, "pci"),
            Location::Sf {
                aux_name,
                parent_pci,
            } => {
                let parent = self.pci_function_dir(parent_pci);
                if !parent.is_dir() {
                    return Err(io::Error::new(
                        io::ErrorKind::NotFound,
                        format!(
                            "parent PCI function {parent_pci} of {} is not in the tree: add its PF first",
                            spec.name
                        ),
                    ));
                }
                let aux = parent.join(aux_name);
                fs::create_dir_all(&aux)?;
                let sfnum = aux_name.rsplit('.').next().unwrap_or("0");
                write_atomic(&aux.join("sfnum"), &format!("{sfnum}\n"))?;
                self.link(&aux.join("subsystem"), &sys.join("bus/auxiliary"))?;
                self.link(&sys.join("bus/auxiliary/devices").join(aux_name), &aux)?;
                (aux, "auxiliary")
            }
        };
        let dev_name = file_name(&dev_dir);
        if let Some(driver) = &spec.driver {
            self.bind(&dev_dir, bus, driver)?;
        }

        // Netdevs.
        let is_ib = spec.link_layer == LinkLayer::InfiniBand;
        for (i, ifname) in spec.netdevs.iter().enumerate() {
            let net = dev_dir.join("net").join(ifname);
            fs::create_dir_all(&net)?;
            write_atomic(&net.join("type"), if is_ib { "32\n" } else { "1\n" })?;
            write_atomic(&net.join("operstate"), "up\n")?;
            write_atomic(&net.join("address"), &format!("{}\n", mac(&spec.name, i)))?;
            self.link(&net.join("device"), &dev_dir)?;
            self.link(&sys.join("class/net").join(ifname), &net)?;
        }

        // The RDMA device.
        let ib = dev_dir.join("infiniband").join(&spec.name);
        fs::create_dir_all(&ib)?;
        self.link(&ib.join("device"), &dev_dir)?;
        self.link(&ib.join("subsystem"), &sys.join("class/infiniband"))?;
        write_atomic(&ib.join("node_type"), "1: CA\n")?;
        write_atomic(&ib.join("node_guid"), &format!("{}\n", guid(&spec.name)))?;
        write_atomic(&ib.join("hca_type"), &format!("{}\n", spec.hca_type))?;
        write_atomic(&ib.join("fw_ver"), &format!("{}\n", spec.fw_ver))?;
        write_atomic(&ib.join("board_id"), &format!("{}\n", spec.board_id))?;
        for port in 1..=spec.ports {
            let pdir = ib.join("ports").join(port.to_string());
            fs::create_dir_all(&pdir)?;
            let (state, phys) = spec.initial_state(port);
            write_atomic(&pdir.join("state"), &format!("{state}\n"))?;
            write_atomic(&pdir.join("phys_state"), &format!("{phys}\n"))?;
            write_atomic(
                &pdir.join("link_layer"),
                &format!("{}\n", spec.link_layer.as_str()),
            )?;
            // GID 0 (RoCE v1 / IB) and GID 1 (RoCE v2). An IB port's ndevs entries name no
            // netdev (the kernel fails the read; the fixture leaves them empty).
            let ndev = match spec.link_layer {
                LinkLayer::InfiniBand => None,
                _ => spec
                    .netdevs
                    .get(port as usize - 1)
                    .or_else(|| spec.netdevs.last()),
            };
            let attrs = pdir.join("gid_attrs");
            fs::create_dir_all(attrs.join("ndevs"))?;
            fs::create_dir_all(attrs.join("types"))?;
            for (gid, kind) in ["IB/RoCE v1", "RoCE v2"].iter().enumerate() {
                let content = ndev.map(|n| format!("{n}\n")).unwrap_or_default();
                write_atomic(&attrs.join("ndevs").join(gid.to_string()), &content)?;
                write_atomic(
                    &attrs.join("types").join(gid.to_string()),
                    &format!("{kind}\n"),
                )?;
            }
        }
        self.link(&sys.join("class/infiniband").join(&spec.name), &ib)?;
        let verbs_class = sys.join("class/infiniband_verbs");
        fs::create_dir_all(&verbs_class)?;
        write_atomic(&verbs_class.join("abi_version"), "6\n")?;

        // uverbsN.
        let n = match spec.uverbs_index {
            Some(n) => n,
            None => self.lowest_free(&verbs_class, &["uverbs"])?,
        };
        let uverbs = format!("uverbs{n}");
        self.add_class_dev(
            &dev_dir,
            "infiniband_verbs",
            &uverbs,
            &spec.name,
            None,
            UVERBS_MINOR_BASE + n,
        )?;
        write_atomic(
            &dev_dir
                .join("infiniband_verbs")
                .join(&uverbs)
                .join("abi_version"),
            "1\n",
        )?;
        let mut nodes = HcaNodes {
            uverbs,
            ..HcaNodes::default()
        };

        // umadN + issmN per port (same N), for ports with a MAD agent.
        if spec.mad {
            let mad_class = sys.join("class/infiniband_mad");
            fs::create_dir_all(&mad_class)?;
            write_atomic(&mad_class.join("abi_version"), "5\n")?;
            for port in 1..=spec.ports {
                let n = self.lowest_free(&mad_class, &["umad", "issm"])?;
                let (umad, issm) = (format!("umad{n}"), format!("issm{n}"));
                self.add_class_dev(&dev_dir, "infiniband_mad", &umad, &spec.name, Some(port), n)?;
                self.add_class_dev(
                    &dev_dir,
                    "infiniband_mad",
                    &issm,
                    &spec.name,
                    Some(port),
                    ISSM_MINOR_BASE + n,
                )?;
                nodes.umad.push(umad);
                nodes.issm.push(issm);
            }
        }

        // dev/infiniband.
        self.add_char_dev(&nodes.uverbs)?;
        for n in nodes.umad.iter().chain(&nodes.issm) {
            self.add_char_dev(n)?;
        }
        if !self.dev_root().join("infiniband/rdma_cm").exists() {
            self.add_rdma_cm()?;
        }
        tracing::debug!(hca = %spec.name, device = %dev_name, "fixture HCA added");
        Ok(nodes)
    }

    /// Writes `<dev_dir>/<class>/<name>` with `ibdev`, `port`, `dev`, `device`, `subsystem`, and
    /// the `class/<class>/<name>` link.
    fn add_class_dev(
        &self,
        dev_dir: &Path,
        class: &str,
        name: &str,
        ibdev: &str,
        port: Option<u32>,
        minor: u32,
    ) -> io::Result<()> {
        let dir = dev_dir.join(class).join(name);
        fs::create_dir_all(&dir)?;
        write_atomic(&dir.join("ibdev"), &format!("{ibdev}\n"))?;
        if let Some(port) = port {
            write_atomic(&dir.join("port"), &format!("{port}\n"))?;
        }
        write_atomic(&dir.join("dev"), &format!("{IB_MAJOR}:{minor}\n"))?;
        self.link(&dir.join("device"), dev_dir)?;
        let class_dir = self.sys_root().join("class").join(class);
        self.link(&dir.join("subsystem"), &class_dir)?;
        self.link(&class_dir.join(name), &dir)
    }

    /// The lowest `N` such that no entry `<prefix>N` exists in `dir` for any of the prefixes.
    fn lowest_free(&self, dir: &Path, prefixes: &[&str]) -> io::Result<u32> {
        let mut used = BTreeSet::new();
        for entry in fs::read_dir(dir)? {
            let name = entry?.file_name().to_string_lossy().into_owned();
            for p in prefixes {
                if let Some(n) = name.strip_prefix(p).and_then(|n| n.parse::<u32>().ok()) {
                    used.insert(n);
                }
            }
        }
        Ok((0..).find(|n| !used.contains(n)).unwrap_or(0))
    }

    /// Creates (or replaces) the symlink `link` with the relative path to `target`.
    fn link(&self, link: &Path, target: &Path) -> io::Result<()> {
        let parent = link
            .parent()
            .ok_or_else(|| invalid(format!("{} has no parent", link.display())))?;
        fs::create_dir_all(parent)?;
        match fs::symlink_metadata(link) {
            Ok(_) => remove_any(link)?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        symlink(relative(parent, target), link)
    }

    /// Links `<dev_dir>/driver` to `bus/<bus>/drivers/<driver>` and back.
    fn bind(&self, dev_dir: &Path, bus: &str, driver: &str) -> io::Result<()> {
        let drv = self
            .sys_root()
            .join("bus")
            .join(bus)
            .join("drivers")
            .join(driver);
        self.link(&dev_dir.join("driver"), &drv)?;
        self.link(&drv.join(file_name(dev_dir)), dev_dir)
    }

    /// Sets `ports/<port>/{state,phys_state}` of `dev` atomically. Words are expanded the
    /// kernel's way (`DOWN` -> `1: DOWN`, `Polling` -> `2: Polling`, see [`kernel_state`]).
    pub fn set_port_state(
        &self,
        dev: &str,
        port: u32,
        state: &str,
        phys_state: &str,
    ) -> io::Result<()> {
        let pdir = self.ib_dir(dev)?.join("ports").join(port.to_string());
        if !pdir.is_dir() {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("{dev} has no port {port}"),
            ));
        }
        write_atomic(&pdir.join("state"), &format!("{}\n", kernel_state(state)))?;
        write_atomic(
            &pdir.join("phys_state"),
            &format!("{}\n", kernel_phys_state(phys_state)),
        )
    }

    /// Atomically writes any file below the sys root (`rel` like
    /// `class/infiniband/mlx5_0/ports/1/state`), creating its parents: for garbage-content
    /// tests.
    pub fn write_sys(&self, rel: impl AsRef<Path>, contents: &str) -> io::Result<()> {
        let path = self.sys_root().join(rel);
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent)?;
        }
        write_atomic(&path, contents)
    }

    /// Removes one file, link or directory below the sys root.
    pub fn remove_sys(&self, rel: impl AsRef<Path>) -> io::Result<()> {
        let path = self.sys_root().join(rel);
        remove_any(&path)
    }

    /// Creates `dev/infiniband/<name>` (a plain empty file).
    pub fn add_char_dev(&self, name: &str) -> io::Result<()> {
        let dir = self.dev_root().join("infiniband");
        fs::create_dir_all(&dir)?;
        fs::write(dir.join(name), "")
    }

    /// Removes `dev/infiniband/<name>`; an error if it is not there.
    pub fn remove_char_dev(&self, name: &str) -> io::Result<()> {
        fs::remove_file(self.dev_root().join("infiniband").join(name))
    }

    /// Creates `dev/infiniband/rdma_cm`.
    pub fn add_rdma_cm(&self) -> io::Result<()> {
        self.add_char_dev("rdma_cm")
    }

    /// Removes `dev/infiniband/rdma_cm`.
    pub fn remove_rdma_cm(&self) -> io::Result<()> {
        self.remove_char_dev("rdma_cm")
    }

    /// Unbinds the driver of `dev`'s device (PCI function, or auxiliary device of an SF):
    /// removes its `driver` link and the driver's link back. The RDMA device stays, which
    /// models the window before the kernel tears it down (or a wedged teardown).
    pub fn unbind_driver(&self, dev: &str) -> io::Result<()> {
        let dev_dir = self.device_dir(dev)?;
        let link = dev_dir.join("driver");
        let target = lexical_join(&dev_dir, &fs::read_link(&link)?);
        fs::remove_file(&link)?;
        match fs::remove_file(target.join(file_name(&dev_dir))) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    /// Binds `driver` to `dev`'s device again (the bus is taken from its `subsystem` link).
    pub fn bind_driver(&self, dev: &str, driver: &str) -> io::Result<()> {
        let dev_dir = self.device_dir(dev)?;
        let bus = fs::read_link(dev_dir.join("subsystem"))?;
        let bus = bus
            .file_name()
            .map(|b| b.to_string_lossy().into_owned())
            .ok_or_else(|| invalid(format!("{} has a bad subsystem link", dev_dir.display())))?;
        self.bind(&dev_dir, &bus, driver)
    }

    /// Hot removal of `dev`: removes its device directory (the PCI function, or the auxiliary
    /// device of an SF) with everything below it (sub-functions included), every link into it
    /// (`class/*`, `bus/*/devices`, driver back links) and the `dev/infiniband` nodes of the
    /// removed char devices.
    pub fn remove_hca(&self, dev: &str) -> io::Result<()> {
        let dev_dir = self.device_dir(dev)?;
        let sys = self.sys_root();
        // Char devices that live below the removed directory.
        for class in ["class/infiniband_verbs", "class/infiniband_mad"] {
            for (name, target) in links_in(&sys.join(class))? {
                if target.starts_with(&dev_dir) {
                    match self.remove_char_dev(&name) {
                        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                        _ => {}
                    }
                }
            }
        }
        fs::remove_dir_all(&dev_dir)?;
        let mut link_dirs: Vec<PathBuf> = [
            "class/infiniband",
            "class/infiniband_verbs",
            "class/infiniband_mad",
            "class/net",
            "bus/pci/devices",
            "bus/auxiliary/devices",
        ]
        .iter()
        .map(|d| sys.join(d))
        .collect();
        for bus in ["pci", "auxiliary"] {
            let drivers = sys.join("bus").join(bus).join("drivers");
            if let Ok(rd) = fs::read_dir(&drivers) {
                for e in rd.flatten() {
                    link_dirs.push(e.path());
                }
            }
        }
        for dir in link_dirs {
            for (name, target) in links_in(&dir)? {
                if target.starts_with(&dev_dir) {
                    fs::remove_file(dir.join(name))?;
                }
            }
        }
        Ok(())
    }

    /// Removes only the PCI function's directory (and so everything below it): the
    /// `class/infiniband` entry, `bus/pci/devices/<bdf>`, the class char device links and the
    /// dev nodes stay, dangling. The moment between a surprise removal and the kernel's
    /// cleanup.
    pub fn remove_pci_function(&self, bdf: &str) -> io::Result<()> {
        fs::remove_dir_all(self.pci_function_dir(bdf))
    }
}

/// An example node, checked in as `examples/sysfs/two-hca-node`:
/// - `mlx5_0`: ConnectX-6 in InfiniBand mode at `0000:3b:00.0` on NUMA node 0, port ACTIVE;
/// - `mlx5_1`: ConnectX-6 Dx in Ethernet (RoCE) mode at `0000:af:00.0` on NUMA node 1, netdev
///   `ens2f0np0`;
/// - `mlx5_2`: sub-function `mlx5_core.sf.2` on `mlx5_1`'s function, netdev `enp175s0f0s2`.
pub fn example_two_hca_node(root: &Path) -> io::Result<FixtureTree> {
    let tree = FixtureTree::new(root)?;
    tree.add_hca(HcaSpec::connectx_ib("mlx5_0", "0000:3b:00.0").numa(0))?;
    tree.add_hca(
        HcaSpec::connectx_eth("mlx5_1", "0000:af:00.0")
            .numa(1)
            .netdev("ens2f0np0"),
    )?;
    tree.add_hca(HcaSpec::sf("mlx5_2", "mlx5_core.sf.2", "0000:af:00.0").netdev("enp175s0f0s2"))?;
    // ib_core's RDMA netns mode: shared, the kernel default.
    tree.write_sys(NETNS_MODE_PARAM, "Y\n")?;
    Ok(tree)
}

// === helpers ===

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Writes `contents` to a temporary file of its own beside `path` and renames it over `path`
/// (mode 0644 less the umask; not synced: a test's tree need not survive a crash).
fn write_atomic(path: &Path, contents: &str) -> io::Result<()> {
    atomic_file::write_atomic(path, contents.as_bytes(), 0o644, false)
}

fn remove_any(path: &Path) -> io::Result<()> {
    let meta = fs::symlink_metadata(path)?;
    if meta.is_dir() {
        fs::remove_dir_all(path)
    } else {
        fs::remove_file(path)
    }
}

/// The symlinks directly in `dir` with their lexically resolved targets (none if `dir` is
/// absent).
fn links_in(dir: &Path) -> io::Result<Vec<(String, PathBuf)>> {
    let rd = match fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut out = Vec::new();
    for entry in rd {
        let entry = entry?;
        if let Ok(target) = fs::read_link(entry.path()) {
            out.push((
                entry.file_name().to_string_lossy().into_owned(),
                lexical_join(dir, &target),
            ));
        }
    }
    Ok(out)
}

/// `base` joined with `rel`, resolving `..` and `.` without touching the filesystem.
fn lexical_join(base: &Path, rel: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in base.join(rel).components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other.as_os_str()),
        }
    }
    out
}

/// The relative path from directory `from` to `to` (both built by joining plain components
/// onto the same root), spelled the kernel's way.
fn relative(from: &Path, to: &Path) -> PathBuf {
    let f: Vec<Component<'_>> = from.components().collect();
    let t: Vec<Component<'_>> = to.components().collect();
    // Like the kernel (kernfs_get_target_path), the base is a common ancestor of `from` and
    // the target's *parent*: a link to an ancestor still names it (`../../../0000:3b:00.0`).
    let common = f
        .iter()
        .zip(&t[..t.len().saturating_sub(1)])
        .take_while(|(a, b)| a == b)
        .count();
    let mut out = PathBuf::new();
    for _ in common..f.len() {
        out.push("..");
    }
    for c in &t[common..] {
        out.push(c.as_os_str());
    }
    out
}

/// A stable 64-bit FNV-1a hash of `s`'s bytes.
fn fnv(s: &str) -> u64 {
    let mut hasher = fnv::FnvHasher::default();
    std::hash::Hasher::write(&mut hasher, s.as_bytes());
    std::hash::Hasher::finish(&hasher)
}

/// A node GUID in the kernel's `xxxx:xxxx:xxxx:xxxx` form, derived from the device name.
fn guid(name: &str) -> String {
    let h = fnv(name);
    format!(
        "{:04x}:{:04x}:{:04x}:{:04x}",
        0xb8ce_u64,
        0xf600 | (h >> 56),
        (h >> 16) & 0xffff,
        h & 0xffff
    )
}

/// A locally administered MAC derived from the device name and netdev index.
fn mac(name: &str, i: usize) -> String {
    let h = fnv(name).wrapping_add(i as u64);
    let b: Vec<String> = (0..5)
        .map(|k| format!("{:02x}", (h >> (8 * k)) & 0xff))
        .collect();
    format!("02:{}", b.join(":"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// The checked-in example tree (only valid in the real crate layout).
    const EXAMPLE_DIR: &str = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/sysfs/two-hca-node"
    );

    #[derive(Debug, PartialEq, Eq)]
    enum Entry {
        Dir,
        File(Vec<u8>),
        Link(PathBuf),
    }

    /// Every entry below `root` by relative path, ignoring `.keep` files.
    fn snapshot(root: &Path) -> BTreeMap<PathBuf, Entry> {
        fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<PathBuf, Entry>) {
            for e in fs::read_dir(dir).unwrap() {
                let e = e.unwrap();
                if e.file_name() == ".keep" {
                    continue;
                }
                let path = e.path();
                let rel = path.strip_prefix(root).unwrap().to_path_buf();
                let meta = fs::symlink_metadata(&path).unwrap();
                if meta.file_type().is_symlink() {
                    out.insert(rel, Entry::Link(fs::read_link(&path).unwrap()));
                } else if meta.is_dir() {
                    out.insert(rel, Entry::Dir);
                    walk(root, &path, out);
                } else {
                    out.insert(rel, Entry::File(fs::read(&path).unwrap()));
                }
            }
        }
        let mut out = BTreeMap::new();
        walk(root, root, &mut out);
        out
    }

    #[test]
    fn relative_links() {
        assert_eq!(
            relative(
                Path::new("/r/sys/class/infiniband"),
                Path::new("/r/sys/devices/a/b")
            ),
            PathBuf::from("../../devices/a/b")
        );
        assert_eq!(
            relative(Path::new("/r/d/p/f/net/eth0"), Path::new("/r/d/p/f")),
            PathBuf::from("../../../f")
        );
        assert_eq!(
            lexical_join(Path::new("/r/sys/class/net"), Path::new("../../devices/x")),
            PathBuf::from("/r/sys/devices/x")
        );
    }

    #[test]
    fn kernel_state_words() {
        assert_eq!(kernel_state("ACTIVE"), "4: ACTIVE");
        assert_eq!(kernel_state("DOWN"), "1: DOWN");
        assert_eq!(kernel_state("2: INIT"), "2: INIT");
        assert_eq!(kernel_state("garbage"), "garbage");
        assert_eq!(kernel_phys_state("LinkUp"), "5: LinkUp");
        assert_eq!(kernel_phys_state("Polling"), "2: Polling");
        assert_eq!(kernel_phys_state("Disabled"), "3: Disabled");
    }

    #[test]
    fn kernel_layout_links() {
        let dir = tempfile::tempdir().unwrap();
        let tree = FixtureTree::new(dir.path()).unwrap();
        let nodes = tree
            .add_hca(HcaSpec::connectx_eth("mlx5_1", "0000:3b:00.1").netdev("ens1f1"))
            .unwrap();
        assert_eq!(nodes.uverbs, "uverbs0");
        let sys = tree.sys_root();
        let link = |p: &str| fs::read_link(sys.join(p)).unwrap();
        assert_eq!(
            link("class/infiniband/mlx5_1"),
            PathBuf::from("../../devices/pci0000:00/0000:00:02.0/0000:3b:00.1/infiniband/mlx5_1")
        );
        assert_eq!(
            link("bus/pci/devices/0000:3b:00.1"),
            PathBuf::from("../../../devices/pci0000:00/0000:00:02.0/0000:3b:00.1")
        );
        let fn_dir = "devices/pci0000:00/0000:00:02.0/0000:3b:00.1";
        assert_eq!(
            link(&format!("{fn_dir}/driver")),
            PathBuf::from("../../../../bus/pci/drivers/mlx5_core")
        );
        assert_eq!(
            link(&format!("{fn_dir}/infiniband/mlx5_1/device")),
            PathBuf::from("../../../0000:3b:00.1")
        );
        assert_eq!(
            link("class/net/ens1f1"),
            PathBuf::from("../../devices/pci0000:00/0000:00:02.0/0000:3b:00.1/net/ens1f1")
        );
        // Every link resolves.
        for p in [
            "class/infiniband/mlx5_1/device/vendor",
            "class/infiniband_verbs/uverbs0/ibdev",
            "class/infiniband_mad/umad0/port",
            "class/infiniband_mad/issm0/ibdev",
            "class/net/ens1f1/device/numa_node",
            "bus/pci/drivers/mlx5_core/0000:3b:00.1/vendor",
        ] {
            assert!(sys.join(p).is_file(), "{p}");
        }
        assert_eq!(
            fs::read_to_string(sys.join("class/infiniband/mlx5_1/ports/1/gid_attrs/ndevs/1"))
                .unwrap(),
            "ens1f1\n"
        );
        assert!(tree.dev_root().join("infiniband/rdma_cm").is_file());
    }

    #[test]
    fn indexes_are_lowest_free() {
        let dir = tempfile::tempdir().unwrap();
        let tree = FixtureTree::new(dir.path()).unwrap();
        let a = tree
            .add_hca(HcaSpec::connectx_ib("mlx5_0", "0000:3b:00.0").ports(2))
            .unwrap();
        let b = tree
            .add_hca(HcaSpec::connectx_ib("mlx5_1", "0000:3b:00.1"))
            .unwrap();
        assert_eq!(a.uverbs, "uverbs0");
        assert_eq!(a.umad, ["umad0", "umad1"]);
        assert_eq!(a.issm, ["issm0", "issm1"]);
        assert_eq!(b.uverbs, "uverbs1");
        assert_eq!(b.umad, ["umad2"]);
        let c = tree
            .add_hca(HcaSpec::irdma("irdma0", "0000:5e:00.0").iwarp())
            .unwrap();
        assert_eq!(c.uverbs, "uverbs2");
        assert!(c.umad.is_empty());

        tree.remove_hca("mlx5_0").unwrap();
        assert!(!tree.sys_root().join("class/infiniband/mlx5_0").exists());
        assert!(
            fs::symlink_metadata(tree.sys_root().join("bus/pci/devices/0000:3b:00.0")).is_err()
        );
        assert!(!tree.dev_root().join("infiniband/uverbs0").exists());
        assert!(!tree.dev_root().join("infiniband/umad1").exists());
        assert!(tree.dev_root().join("infiniband/uverbs1").exists());
        // Re-adding takes the freed indexes back, like the kernel's IDA.
        let a2 = tree
            .add_hca(HcaSpec::connectx_ib("mlx5_0", "0000:3b:00.0"))
            .unwrap();
        assert_eq!(a2.uverbs, "uverbs0");
        assert_eq!(a2.umad, ["umad0"]);
        let d = tree
            .add_hca(HcaSpec::connectx_eth("mlx5_5", "0000:5e:00.1").uverbs_index(7))
            .unwrap();
        assert_eq!(d.uverbs, "uverbs7");
        assert_eq!(d.umad, ["umad1"]);
    }

    #[test]
    fn sf_needs_its_parent() {
        let dir = tempfile::tempdir().unwrap();
        let tree = FixtureTree::new(dir.path()).unwrap();
        let err = tree
            .add_hca(HcaSpec::sf("mlx5_4", "mlx5_core.sf.2", "0000:3b:00.0"))
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
        assert!(
            tree.add_pci_function(HcaSpec::sf("mlx5_4", "mlx5_core.sf.2", "0000:3b:00.0"))
                .is_err()
        );
    }

    /// Generated with the builder, the tree must equal the checked-in example. Run with
    /// `UPDATE_SYSFS_EXAMPLES=1` to rewrite the example from the builder.
    #[test]
    fn example_tree_matches_builder() {
        let example = Path::new(EXAMPLE_DIR);
        if std::env::var_os("UPDATE_SYSFS_EXAMPLES").is_some() {
            for sub in ["sys", "dev"] {
                match fs::remove_dir_all(example.join(sub)) {
                    Err(e) if e.kind() != io::ErrorKind::NotFound => panic!("{e}"),
                    _ => {}
                }
            }
            example_two_hca_node(example).unwrap();
        }
        let dir = tempfile::tempdir().unwrap();
        example_two_hca_node(dir.path()).unwrap();
        let built = snapshot(dir.path());
        // git keeps no empty directory: the builder must not rely on one.
        for (path, entry) in &built {
            if *entry == Entry::Dir {
                assert!(
                    built.keys().any(|p| p.parent() == Some(path.as_path())),
                    "empty directory {}",
                    path.display()
                );
            }
        }
        let checked_in = snapshot(example);
        let only_built: Vec<_> = built
            .keys()
            .filter(|k| !checked_in.contains_key(*k))
            .collect();
        let only_checked: Vec<_> = checked_in
            .keys()
            .filter(|k| !built.contains_key(*k))
            .collect();
        assert!(
            only_built.is_empty() && only_checked.is_empty(),
            "only built: {only_built:?}\nonly checked in: {only_checked:?}\n\
             (regenerate with UPDATE_SYSFS_EXAMPLES=1)"
        );
        for (path, entry) in &built {
            assert_eq!(
                Some(entry),
                checked_in.get(path),
                "{} differs (regenerate with UPDATE_SYSFS_EXAMPLES=1)",
                path.display()
            );
        }
    }
}
