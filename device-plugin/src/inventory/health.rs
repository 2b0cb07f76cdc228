//! Health of one HCA, from what discovery read.
//!
//! An HCA is Healthy when all of these hold:
//!
//! - **at least one port is `ACTIVE` and `LinkUp`.** A dual-port card with one cable
//!   unplugged still carries RDMA on the other port, and a pod handed the HCA can use it, so a
//!   single down port does not make the HCA unhealthy. Only when *no* port is usable is the
//!   HCA unhealthy, and then every port's bad `state`/`phys_state` is listed
//!   (`port 1 state DOWN`, `port 1 phys_state Polling`); an HCA without ports gets `no ports`;
//! - its PCI function is there (`PCI function missing` otherwise; not checked for
//!   [`Bus::Virtual`]). Discovery leaves both `vendor` and `device_id` `None` exactly when it
//!   cannot read the PCI function (a dangling `device` link, a hot-removed function), which is
//!   what this check looks at; an SF whose parent PCI function is unknown counts as missing;
//! - a driver is bound (`driver not bound`; not checked for [`Bus::Virtual`], nor on top of a
//!   missing PCI function);
//! - it has a `uverbs` device (`no uverbs device`) and every char device listed for it is
//!   present under the dev root (`char device uverbs0 missing`);
//! - the shared `rdma_cm` node is present (`rdma_cm missing`).
//!
//! The reasons come in that order (PCI function, driver, ports, char devices, rdma_cm). The
//! kubelet only sees Healthy/Unhealthy; the reasons go to logs, metrics and `discover`.

use super::hca::{Bus, CharDevKind, Hca, Health, Port};

/// Reason: the PCI function (or an SF's parent function) cannot be read.
pub const PCI_FUNCTION_MISSING: &str = "PCI function missing";
/// Reason: no driver is bound to the device.
pub const DRIVER_NOT_BOUND: &str = "driver not bound";
/// Reason: the RDMA device has no port.
pub const NO_PORTS: &str = "no ports";
/// Reason: no `uverbsN` belongs to the RDMA device.
pub const NO_UVERBS: &str = "no uverbs device";
/// Reason: `<dev-root>/infiniband/rdma_cm` is missing.
pub const RDMA_CM_MISSING: &str = "rdma_cm missing";

/// The health of `hca`; `rdma_cm_present` is [`crate::inventory::hca::Inventory::rdma_cm`]'s `present`.
pub fn assess(hca: &Hca, rdma_cm_present: bool) -> Health {
    let mut reasons = Vec::new();

    let pci_missing = match &hca.bus {
        Bus::Virtual => false,
        Bus::Pci { .. } => hca.vendor.is_none() && hca.device_id.is_none(),
        Bus::Auxiliary { parent_pci, .. } => {
            parent_pci.is_none() || (hca.vendor.is_none() && hca.device_id.is_none())
        }
    };
    if pci_missing {
        reasons.push(PCI_FUNCTION_MISSING.to_string());
    } else if hca.bus != Bus::Virtual && hca.driver.is_none() {
        reasons.push(DRIVER_NOT_BOUND.to_string());
    }

    if hca.ports.is_empty() {
        reasons.push(NO_PORTS.to_string());
    } else if !hca.ports.iter().any(port_usable) {
        for p in &hca.ports {
            if !p.is_active() {
                reasons.push(format!("port {} state {}", p.number, word(&p.state)));
            }
            if !p.is_link_up() {
                reasons.push(format!(
                    "port {} phys_state {}",
                    p.number,
                    word(&p.phys_state)
                ));
            }
        }
    }

    if !hca
        .char_devices
        .iter()
        .any(|c| c.kind == CharDevKind::Uverbs)
    {
        reasons.push(NO_UVERBS.to_string());
    }
    for c in hca.char_devices.iter().filter(|c| !c.present) {
        reasons.push(format!("char device {} missing", c.name));
    }

    if !rdma_cm_present {
        reasons.push(RDMA_CM_MISSING.to_string());
    }
    Health { reasons }
}

/// `"1: DOWN"` -> `DOWN`; empty -> `unknown`; anything unprintable replaced by `?`.
fn word(s: &str) -> String {
    let s = s.trim();
    let w = s.split_once(':').map_or(s, |(_, w)| w.trim());
    if w.is_empty() {
        return "unknown".to_string();
    }
    w.chars()
        .take(64)
        .map(|c| {
            if c.is_ascii_graphic() || c == ' ' {
                c
            } else {
                '?'
            }
        })
        .collect()
}

/// Whether `port` can carry traffic (`ACTIVE` and `LinkUp`).
pub fn port_usable(port: &Port) -> bool {
    port.is_active() && port.is_link_up()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::hca::{CharDev, LinkLayer};

    fn port(n: u32, state: &str, phys: &str) -> Port {
        Port {
            number: n,
            state: state.into(),
            phys_state: phys.into(),
            link_layer: LinkLayer::InfiniBand,
            netdevs: vec![],
        }
    }

    fn dev(kind: CharDevKind, name: &str, present: bool) -> CharDev {
        CharDev {
            kind,
            name: name.into(),
            port: (kind != CharDevKind::Uverbs).then_some(1),
            present,
        }
    }

    fn good() -> Hca {
        Hca {
            name: "mlx5_0".into(),
            bus: Bus::Pci {
                address: "0000:3b:00.0".into(),
            },
            vendor: Some("15b3".into()),
            device_id: Some("101b".into()),
            driver: Some("mlx5_core".into()),
            numa_node: Some(0),
            netdevs: vec![],
            ports: vec![port(1, "4: ACTIVE", "5: LinkUp")],
            char_devices: vec![
                dev(CharDevKind::Uverbs, "uverbs0", true),
                dev(CharDevKind::Umad, "umad0", true),
                dev(CharDevKind::Issm, "issm0", true),
            ],
            health: Health::healthy(),
        }
    }

    #[test]
    fn healthy() {
        let h = assess(&good(), true);
        assert!(h.is_healthy());
        assert_eq!(h.kubelet_str(), "Healthy");
    }

    #[test]
    fn port_down() {
        let mut hca = good();
        hca.ports[0] = port(1, "1: DOWN", "2: Polling");
        assert_eq!(
            assess(&hca, true).reasons,
            ["port 1 state DOWN", "port 1 phys_state Polling"]
        );
        hca.ports[0] = port(1, "2: INIT", "5: LinkUp");
        assert_eq!(assess(&hca, true).reasons, ["port 1 state INIT"]);
    }

    #[test]
    fn one_usable_port_is_enough() {
        let mut hca = good();
        hca.ports.push(port(2, "1: DOWN", "3: Disabled"));
        assert!(assess(&hca, true).is_healthy());
        hca.ports[0] = port(1, "4: ACTIVE", "4: PortConfigurationTraining");
        assert_eq!(
            assess(&hca, true).reasons,
            [
                "port 1 phys_state PortConfigurationTraining",
                "port 2 state DOWN",
                "port 2 phys_state Disabled"
            ]
        );
        assert!(!port_usable(&hca.ports[0]));
    }

    #[test]
    fn no_ports_and_garbage_state() {
        let mut hca = good();
        hca.ports.clear();
        assert_eq!(assess(&hca, true).reasons, [NO_PORTS]);
        hca.ports = vec![port(1, "", "\u{1}bad\u{7f}")];
        assert_eq!(
            assess(&hca, true).reasons,
            ["port 1 state unknown", "port 1 phys_state ?bad?"]
        );
    }

    #[test]
    fn char_devices_and_rdma_cm() {
        let mut hca = good();
        hca.char_devices[0].present = false;
        hca.char_devices[2].present = false;
        assert_eq!(
            assess(&hca, false).reasons,
            [
                "char device uverbs0 missing",
                "char device issm0 missing",
                RDMA_CM_MISSING
            ]
        );
        hca.char_devices.remove(0);
        assert!(assess(&hca, true).reasons.contains(&NO_UVERBS.to_string()));
    }

    #[test]
    fn driver_and_pci_function() {
        let mut hca = good();
        hca.driver = None;
        assert_eq!(assess(&hca, true).reasons, [DRIVER_NOT_BOUND]);
        hca.vendor = None;
        assert_eq!(
            assess(&hca, true).reasons,
            [DRIVER_NOT_BOUND],
            "one unreadable id is not a missing function"
        );
        hca.device_id = None;
        assert_eq!(assess(&hca, true).reasons, [PCI_FUNCTION_MISSING]);
    }

    #[test]
    fn sub_function_and_virtual() {
        let mut hca = good();
        hca.bus = Bus::Auxiliary {
            name: "mlx5_core.sf.2".into(),
            parent_pci: Some("0000:3b:00.0".into()),
        };
        hca.driver = Some("mlx5_core.sf".into());
        assert!(assess(&hca, true).is_healthy());
        hca.bus = Bus::Auxiliary {
            name: "mlx5_core.sf.2".into(),
            parent_pci: None,
        };
        assert_eq!(assess(&hca, true).reasons, [PCI_FUNCTION_MISSING]);
        // A software device (rxe) has no PCI function and no bound driver to check.
        hca.bus = Bus::Virtual;
        hca.vendor = None;
        hca.device_id = None;
        hca.driver = None;
        assert!(assess(&hca, true).is_healthy());
    }
}
