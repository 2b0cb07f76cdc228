//! Which HCAs a pool takes: the `selectors` of a pool in the config file.
//!
//! The semantics are those of Mellanox's k8s-rdma-shared-dev-plugin: the values inside one
//! field are OR'd, the fields are AND'd, and an empty field matches anything (so the default
//! `Selectors` matches every HCA). On top of its `vendors`, `deviceIDs`, `drivers`, `ifNames`
//! and `linkTypes` (here `linkLayers`) there are `rdmaDevices`, `pciAddresses` and `numaNodes`.

use globset::{Glob, GlobBuilder, GlobSet, GlobSetBuilder};
use serde::{Deserialize, Serialize};

use crate::inventory::hca::{Hca, LinkLayer};

/// The HCA filter of one pool. Every field empty means "any HCA".
#[derive(Deserialize, Serialize, Default, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Selectors {
    /// PCI vendor ids (`15b3`); case-insensitive, `0x` prefix allowed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub vendors: Vec<String>,
    /// PCI device ids (`1017`); case-insensitive, `0x` prefix allowed.
    #[serde(default, rename = "deviceIDs", skip_serializing_if = "Vec::is_empty")]
    pub device_ids: Vec<String>,
    /// Kernel drivers of the PCI function (`mlx5_core`), exact.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub drivers: Vec<String>,
    /// Netdev names, exact; an HCA matches when any of its netdevs is listed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub if_names: Vec<String>,
    /// `InfiniBand` or `Ethernet` (case-insensitive; Mellanox's `linkTypes` spellings
    /// `infiniband`, `ether` and `ethernet` are accepted too). An HCA matches when any of its
    /// ports has a listed link layer.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub link_layers: Vec<String>,
    /// RDMA device names, globs allowed (`mlx5_*`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rdma_devices: Vec<String>,
    /// PCI addresses of the HCA's function (the parent function for a sub-function), globs
    /// allowed (`0000:3b:00.*`), case-insensitive.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pci_addresses: Vec<String>,
    /// NUMA nodes; `-1` selects HCAs whose NUMA node the kernel does not know.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub numa_nodes: Vec<i64>,
}

impl Selectors {
    /// Whether no field restricts anything (every HCA matches).
    pub fn is_empty(&self) -> bool {
        self == &Self::default()
    }

    /// Checks what [`Selectors::matches`] would otherwise only find out at match time: globs
    /// that do not compile, link layers that are not known, ids that are not 16-bit hex, empty
    /// strings. The message names the field and the value.
    pub fn validate(&self) -> Result<(), String> {
        for (field, values) in [("vendors", &self.vendors), ("deviceIDs", &self.device_ids)] {
            for v in values {
                if parse_pci_id(v).is_none() {
                    return Err(format!(
                        "{field}: `{v}` is not a 16-bit hexadecimal PCI id (like `15b3` or `0x15b3`)"
                    ));
                }
            }
        }
        for (field, values) in [
            ("drivers", &self.drivers),
            ("ifNames", &self.if_names),
            ("rdmaDevices", &self.rdma_devices),
            ("pciAddresses", &self.pci_addresses),
        ] {
            if values.iter().any(|v| v.trim().is_empty()) {
                return Err(format!("{field}: empty value"));
            }
        }
        for v in &self.link_layers {
            if parse_link_layer(v).is_none() {
                return Err(format!(
                    "linkLayers: `{v}` is not a link layer (use `InfiniBand` or `Ethernet`)"
                ));
            }
        }
        glob_set(&self.rdma_devices, false).map_err(|e| format!("rdmaDevices: {e}"))?;
        glob_set(&self.pci_addresses, true).map_err(|e| format!("pciAddresses: {e}"))?;
        if let Some(n) = self.numa_nodes.iter().find(|n| **n < -1) {
            return Err(format!(
                "numaNodes: {n} is not a NUMA node (use a node number, or -1 for none)"
            ));
        }
        Ok(())
    }

    /// Whether `hca` passes every non-empty field (and, inside a field, any value).
    ///
    /// A value that [`Selectors::validate`] would reject matches nothing.
    pub fn matches(&self, hca: &Hca) -> bool {
        self.matches_vendor(hca)
            && self.matches_device_id(hca)
            && self.matches_driver(hca)
            && self.matches_if_name(hca)
            && self.matches_link_layer(hca)
            && self.matches_rdma_device(hca)
            && self.matches_pci_address(hca)
            && self.matches_numa_node(hca)
    }

    fn matches_vendor(&self, hca: &Hca) -> bool {
        any_pci_id(&self.vendors, hca.vendor.as_deref())
    }

    fn matches_device_id(&self, hca: &Hca) -> bool {
        any_pci_id(&self.device_ids, hca.device_id.as_deref())
    }

    fn matches_driver(&self, hca: &Hca) -> bool {
        self.drivers.is_empty()
            || hca
                .driver
                .as_deref()
                .is_some_and(|d| self.drivers.iter().any(|s| s == d))
    }

    fn matches_if_name(&self, hca: &Hca) -> bool {
        self.if_names.is_empty()
            || hca
                .netdevs
                .iter()
                .chain(hca.ports.iter().flat_map(|p| p.netdevs.iter()))
                .any(|n| self.if_names.contains(n))
    }

    fn matches_link_layer(&self, hca: &Hca) -> bool {
        if self.link_layers.is_empty() {
            return true;
        }
        let wanted: Vec<LinkLayer> = self
            .link_layers
            .iter()
            .filter_map(|s| parse_link_layer(s))
            .collect();
        hca.ports.iter().any(|p| wanted.contains(&p.link_layer))
    }

    fn matches_rdma_device(&self, hca: &Hca) -> bool {
        self.rdma_devices.is_empty()
            || glob_set(&self.rdma_devices, false).is_ok_and(|set| set.is_match(&hca.name))
    }

    fn matches_pci_address(&self, hca: &Hca) -> bool {
        self.pci_addresses.is_empty()
            || hca.pci_address().is_some_and(|addr| {
                glob_set(&self.pci_addresses, true).is_ok_and(|set| set.is_match(addr))
            })
    }

    fn matches_numa_node(&self, hca: &Hca) -> bool {
        self.numa_nodes.is_empty() || self.numa_nodes.contains(&hca.numa_node.unwrap_or(-1))
    }
}

/// `15b3`, `0x15B3`, ` 15b3 ` -> `0x15b3`.
fn parse_pci_id(s: &str) -> Option<u16> {
    let s = s.trim();
    let hex = s
        .strip_prefix("0x")
        .or_else(|| s.strip_prefix("0X"))
        .unwrap_or(s);
    if hex.is_empty() || hex.len() > 4 {
        return None;
    }
    u16::from_str_radix(hex, 16).ok()
}

/// Empty `wanted` matches anything; otherwise `have` must be one of them (compared as numbers,
/// so case, `0x` and leading zeros do not matter).
fn any_pci_id(wanted: &[String], have: Option<&str>) -> bool {
    if wanted.is_empty() {
        return true;
    }
    let Some(have) = have.and_then(parse_pci_id) else {
        return false;
    };
    wanted.iter().any(|w| parse_pci_id(w) == Some(have))
}

/// A selector value as a link layer: `InfiniBand`/`infiniband`, `Ethernet`/`ether`/`ethernet`,
/// any case.
fn parse_link_layer(s: &str) -> Option<LinkLayer> {
    match s.trim().to_ascii_lowercase().as_str() {
        "infiniband" => Some(LinkLayer::InfiniBand),
        "ethernet" | "ether" => Some(LinkLayer::Ethernet),
        _ => None,
    }
}

fn glob_set(patterns: &[String], case_insensitive: bool) -> Result<GlobSet, globset::Error> {
    let mut set = GlobSetBuilder::new();
    for p in patterns {
        let glob: Glob = GlobBuilder::new(p.trim())
            .case_insensitive(case_insensitive)
            .literal_separator(false)
            .build()?;
        set.add(glob);
    }
    set.build()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::hca::{Bus, Health, Port};

    fn port(number: u32, link_layer: LinkLayer, netdevs: &[&str]) -> Port {
        Port {
            number,
            state: "4: ACTIVE".into(),
            phys_state: "5: LinkUp".into(),
            link_layer,
            netdevs: netdevs.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn mlx5_0() -> Hca {
        Hca {
            name: "mlx5_0".into(),
            bus: Bus::Pci {
                address: "0000:3b:00.0".into(),
            },
            vendor: Some("15b3".into()),
            device_id: Some("1017".into()),
            driver: Some("mlx5_core".into()),
            numa_node: Some(0),
            netdevs: vec!["ib0".into()],
            ports: vec![port(1, LinkLayer::InfiniBand, &["ib0"])],
            char_devices: vec![],
            health: Health::healthy(),
        }
    }

    fn roce_sf() -> Hca {
        Hca {
            name: "mlx5_4".into(),
            bus: Bus::Auxiliary {
                name: "mlx5_core.sf.2".into(),
                parent_pci: Some("0000:AF:00.1".into()),
            },
            vendor: Some("15b3".into()),
            device_id: Some("101d".into()),
            driver: Some("mlx5_core".into()),
            numa_node: Some(1),
            netdevs: vec![],
            ports: vec![port(1, LinkLayer::Ethernet, &["enp175s0f1s2"])],
            char_devices: vec![],
            health: Health::healthy(),
        }
    }

    fn rxe() -> Hca {
        Hca {
            name: "rxe0".into(),
            bus: Bus::Virtual,
            vendor: None,
            device_id: None,
            driver: None,
            numa_node: None,
            netdevs: vec!["eth0".into()],
            ports: vec![port(1, LinkLayer::Ethernet, &["eth0"])],
            char_devices: vec![],
            health: Health::healthy(),
        }
    }

    fn parse(yaml: &str) -> Selectors {
        let s: Selectors = rdma_streams_yaml::from_str(yaml).expect("selectors parse");
        s.validate().expect("selectors valid");
        s
    }

    fn matching(s: &Selectors) -> Vec<String> {
        [mlx5_0(), roce_sf(), rxe()]
            .into_iter()
            .filter(|h| s.matches(h))
            .map(|h| h.name)
            .collect()
    }

    #[test]
    fn empty_matches_everything() {
        let s = Selectors::default();
        assert!(s.is_empty());
        assert_eq!(s.validate(), Ok(()));
        assert_eq!(matching(&s), ["mlx5_0", "mlx5_4", "rxe0"]);
        assert_eq!(parse("{}"), s);
    }

    #[test]
    fn vendor_and_device_ids_are_case_and_prefix_insensitive() {
        assert_eq!(
            matching(&parse("vendors: ['0x15B3']")),
            ["mlx5_0", "mlx5_4"]
        );
        assert_eq!(
            matching(&parse("deviceIDs: ['0X101D', '8086']")),
            ["mlx5_4"]
        );
        assert_eq!(
            matching(&parse("deviceIDs: ['1018']")),
            Vec::<String>::new()
        );
        assert_eq!(
            matching(&parse("{vendors: ['15b3'], deviceIDs: ['1017']}")),
            ["mlx5_0"]
        );
    }

    #[test]
    fn fields_and_values() {
        // OR inside a field.
        assert_eq!(
            matching(&parse("rdmaDevices: ['mlx5_0', 'rxe*']")),
            ["mlx5_0", "rxe0"]
        );
        // AND across fields.
        assert_eq!(
            matching(&parse("{rdmaDevices: ['mlx5_*'], linkLayers: [ethernet]}")),
            ["mlx5_4"]
        );
        assert_eq!(
            matching(&parse("drivers: [mlx5_core]")),
            ["mlx5_0", "mlx5_4"]
        );
        assert_eq!(
            matching(&parse("drivers: [rdma_rxe]")),
            Vec::<String>::new()
        );
    }

    #[test]
    fn link_layers() {
        assert_eq!(matching(&parse("linkLayers: [InfiniBand]")), ["mlx5_0"]);
        assert_eq!(matching(&parse("linkLayers: [infiniband]")), ["mlx5_0"]);
        assert_eq!(matching(&parse("linkLayers: [ether]")), ["mlx5_4", "rxe0"]);
        assert_eq!(
            matching(&parse("linkLayers: [ETHERNET, InfiniBand]")),
            ["mlx5_0", "mlx5_4", "rxe0"]
        );
    }

    #[test]
    fn if_names_match_any_netdev() {
        assert_eq!(matching(&parse("ifNames: [ib0]")), ["mlx5_0"]);
        // Only known through the port's gid ndevs.
        assert_eq!(
            matching(&parse("ifNames: [enp175s0f1s2, eth0]")),
            ["mlx5_4", "rxe0"]
        );
    }

    #[test]
    fn pci_addresses() {
        assert_eq!(
            matching(&parse("pciAddresses: ['0000:3b:00.*']")),
            ["mlx5_0"]
        );
        // The SF matches through its parent function, case-insensitively.
        assert_eq!(
            matching(&parse("pciAddresses: ['0000:af:00.1']")),
            ["mlx5_4"]
        );
        assert_eq!(
            matching(&parse("pciAddresses: ['0000:[3a]?:00.?']")),
            ["mlx5_0", "mlx5_4"]
        );
    }

    #[test]
    fn numa_nodes() {
        assert_eq!(matching(&parse("numaNodes: [1]")), ["mlx5_4"]);
        assert_eq!(matching(&parse("numaNodes: [0, -1]")), ["mlx5_0", "rxe0"]);
    }

    #[test]
    fn yaml_names_round_trip() {
        let s = parse(
            "{vendors: [15b3], deviceIDs: ['1017'], drivers: [mlx5_core], ifNames: [ib0], \
             linkLayers: [InfiniBand], rdmaDevices: ['mlx5_*'], pciAddresses: ['0000:3b:00.0'], \
             numaNodes: [0]}",
        );
        assert_eq!(matching(&s), ["mlx5_0"]);
        let text = rdma_streams_yaml::to_string(&s).expect("serialize");
        assert!(text.contains("deviceIDs:"), "{text}");
        assert_eq!(
            rdma_streams_yaml::from_str::<Selectors>(&text).expect("reparse"),
            s
        );
    }

    #[test]
    fn unknown_field_is_an_error() {
        let err =
            rdma_streams_yaml::from_str::<Selectors>("linkTypes: [ether]").expect_err("unknown");
        assert!(
            err.to_string().contains("unknown field `linkTypes`"),
            "{err}"
        );
    }

    #[test]
    fn invalid_values() {
        let bad = |yaml: &str, want: &str| {
            let s: Selectors = rdma_streams_yaml::from_str(yaml).expect("parse");
            let err = s.validate().expect_err(yaml);
            assert!(err.contains(want), "{yaml}: {err}");
            // Invalid values never match.
            assert!(!s.matches(&mlx5_0()), "{yaml}");
        };
        bad("rdmaDevices: ['mlx5_[0']", "rdmaDevices");
        bad("pciAddresses: ['0000:{3b']", "pciAddresses");
        bad("linkLayers: [iwarp]", "`iwarp` is not a link layer");
        bad("vendors: [mellanox]", "vendors: `mellanox`");
        bad("deviceIDs: ['0x10170']", "deviceIDs");
        bad("vendors: ['']", "vendors");
        bad("drivers: ['']", "drivers: empty");
        bad("numaNodes: [-2]", "numaNodes");
    }
}
