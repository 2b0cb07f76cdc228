//! The RDMA inventory of one node: HCAs, their ports, char devices and health.
//!
//! Produced by [`crate::inventory::discovery`] from a sysfs and a dev tree, consumed by the pools, the
//! `discover` command and the kubelet frontend. Plain data, serialisable for `discover -o`.

use serde::Serialize;

use super::netns_mode::NetnsMode;

/// How a port carries RDMA (`ports/<n>/link_layer`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum LinkLayer {
    InfiniBand,
    /// RoCE.
    Ethernet,
    /// Anything else the kernel reports (for example iWARP devices report `Ethernet` too, but
    /// unknown future values are kept verbatim).
    Other(String),
}

impl LinkLayer {
    /// Parses the kernel's `link_layer` file content.
    pub fn parse(s: &str) -> Self {
        match s.trim() {
            "InfiniBand" => Self::InfiniBand,
            "Ethernet" => Self::Ethernet,
            other => Self::Other(other.to_string()),
        }
    }

    /// The kernel's spelling.
    pub fn as_str(&self) -> &str {
        match self {
            Self::InfiniBand => "InfiniBand",
            Self::Ethernet => "Ethernet",
            Self::Other(s) => s,
        }
    }
}

/// Which bus the RDMA device hangs off.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(
    tag = "kind",
    rename_all = "camelCase",
    rename_all_fields = "camelCase"
)]
pub enum Bus {
    /// A PCI function (PF or VF), e.g. `0000:3b:00.0`.
    Pci { address: String },
    /// An auxiliary-bus device (a Mellanox sub-function, `mlx5_core.sf.2`), with the PCI
    /// function it lives on when that can be found.
    Auxiliary {
        name: String,
        parent_pci: Option<String>,
    },
    /// A device with no bus link (software devices such as rxe or siw).
    Virtual,
}

/// The kind of a char device under `<dev-root>/infiniband/`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CharDevKind {
    Uverbs,
    Umad,
    Issm,
    RdmaCm,
}

/// One char device an allocation hands to a container.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CharDev {
    pub kind: CharDevKind,
    /// The file name under `<dev-root>/infiniband/`, e.g. `uverbs0`, `umad1`, `rdma_cm`.
    pub name: String,
    /// The port it belongs to (umad and issm are per port).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port: Option<u32>,
    /// Whether the node exists under the dev root.
    pub present: bool,
}

impl CharDev {
    /// The path of this device below the dev root, e.g. `infiniband/uverbs0`.
    pub fn rel_path(&self) -> String {
        format!("infiniband/{}", self.name)
    }
}

/// One port of an HCA (`class/infiniband/<dev>/ports/<n>`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Port {
    pub number: u32,
    /// `state` as the kernel writes it, e.g. `4: ACTIVE`.
    pub state: String,
    /// `phys_state` as the kernel writes it, e.g. `5: LinkUp`.
    pub phys_state: String,
    pub link_layer: LinkLayer,
    /// Netdevs bound to this port (`gid_attrs/ndevs/*`), de-duplicated.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub netdevs: Vec<String>,
}

impl Port {
    /// `state` is ACTIVE (`4: ACTIVE`).
    pub fn is_active(&self) -> bool {
        state_word(&self.state) == "ACTIVE"
    }

    /// `phys_state` is LinkUp (`5: LinkUp`).
    pub fn is_link_up(&self) -> bool {
        state_word(&self.phys_state) == "LinkUp"
    }
}

/// `"4: ACTIVE"` -> `"ACTIVE"`; a bare word stays as it is.
fn state_word(s: &str) -> &str {
    let s = s.trim();
    s.split_once(':').map_or(s, |(_, w)| w.trim())
}

/// Health of an HCA with the reasons it is not healthy.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Health {
    /// Empty when healthy.
    pub reasons: Vec<String>,
}

impl Health {
    pub fn healthy() -> Self {
        Self::default()
    }

    pub fn is_healthy(&self) -> bool {
        self.reasons.is_empty()
    }

    /// The kubelet health string.
    pub fn kubelet_str(&self) -> &'static str {
        if self.is_healthy() {
            "Healthy"
        } else {
            "Unhealthy"
        }
    }
}

/// Serialised as `{status: Healthy|Unhealthy, reasons: [...]}` (reasons only when unhealthy).
impl Serialize for Health {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut st = s.serialize_struct("Health", 2)?;
        st.serialize_field("status", self.kubelet_str())?;
        if self.is_healthy() {
            st.skip_field("reasons")?;
        } else {
            st.serialize_field("reasons", &self.reasons)?;
        }
        st.end()
    }
}

/// One RDMA device (`class/infiniband/<name>`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Hca {
    /// The RDMA device name, e.g. `mlx5_0`.
    pub name: String,
    pub bus: Bus,
    /// PCI vendor id without `0x`, lower case (`15b3`), from the PCI function (the parent's for
    /// auxiliary devices).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vendor: Option<String>,
    /// PCI device id without `0x`, lower case (`1017`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_id: Option<String>,
    /// Bound kernel driver (basename of `device/driver`), `None` when unbound.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub driver: Option<String>,
    /// NUMA node of the PCI function; `None` when the kernel says -1 or nothing.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub numa_node: Option<i64>,
    /// Netdevs of the device (`device/net/*` and the ports' `gid_attrs/ndevs`), sorted.
    pub netdevs: Vec<String>,
    pub ports: Vec<Port>,
    /// `uverbsN`, `umadN` per port, `issmN` per InfiniBand port. A node missing under the dev
    /// root stays listed with `present: false` (and makes the HCA unhealthy).
    pub char_devices: Vec<CharDev>,
    pub health: Health,
}

impl Hca {
    /// The PCI address this HCA's hardware lives on (its own, or its parent's for an SF).
    pub fn pci_address(&self) -> Option<&str> {
        match &self.bus {
            Bus::Pci { address } => Some(address),
            Bus::Auxiliary { parent_pci, .. } => parent_pci.as_deref(),
            Bus::Virtual => None,
        }
    }

    /// Link layers of all ports, de-duplicated in port order.
    pub fn link_layers(&self) -> Vec<LinkLayer> {
        let mut out: Vec<LinkLayer> = Vec::new();
        for p in &self.ports {
            if !out.contains(&p.link_layer) {
                out.push(p.link_layer.clone());
            }
        }
        out
    }

    /// Whether any port is InfiniBand (issm devices are handed out only then).
    pub fn has_infiniband_port(&self) -> bool {
        self.ports
            .iter()
            .any(|p| p.link_layer == LinkLayer::InfiniBand)
    }
}

/// Everything discovery found on the node.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Inventory {
    /// Sorted by name.
    pub hcas: Vec<Hca>,
    /// The shared `rdma_cm` node (`<dev-root>/infiniband/rdma_cm`).
    pub rdma_cm: CharDev,
    /// The kernel's RDMA network-namespace mode ([`crate::inventory::netns_mode`]).
    pub netns_mode: NetnsMode,
}

impl Default for CharDev {
    fn default() -> Self {
        Self {
            kind: CharDevKind::RdmaCm,
            name: "rdma_cm".to_string(),
            port: None,
            present: false,
        }
    }
}

impl Inventory {
    pub fn hca(&self, name: &str) -> Option<&Hca> {
        self.hcas.iter().find(|h| h.name == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_words() {
        let p = Port {
            number: 1,
            state: "4: ACTIVE\n".into(),
            phys_state: "5: LinkUp".into(),
            link_layer: LinkLayer::parse("InfiniBand\n"),
            netdevs: vec![],
        };
        assert!(p.is_active() && p.is_link_up());
        let down = Port {
            state: "1: DOWN".into(),
            phys_state: "3: Disabled".into(),
            ..p
        };
        assert!(!down.is_active() && !down.is_link_up());
        assert_eq!(LinkLayer::parse("Ethernet").as_str(), "Ethernet");
        assert_eq!(LinkLayer::parse("weird"), LinkLayer::Other("weird".into()));
    }

    /// The test kit's fixture spells link layers as the kernel does, so they parse to ours.
    #[test]
    fn fixture_link_layers_parse() {
        use rdma_device_plugin_testkit::fixture::LinkLayer as Fixture;
        assert_eq!(
            LinkLayer::parse(Fixture::InfiniBand.as_str()),
            LinkLayer::InfiniBand
        );
        assert_eq!(
            LinkLayer::parse(Fixture::Ethernet.as_str()),
            LinkLayer::Ethernet
        );
    }
}
