//! The second health source: ask libibverbs (through rdma-sys) for each port's state.
//!
//! sysfs is the first source and is always read. Where libibverbs finds and opens the device,
//! a port the verbs layer reports as not ACTIVE / not LinkUp adds an unhealthy reason; a device
//! it cannot open (an unprivileged container) is inconclusive and changes nothing. Where libibverbs has no device at all (no provider, no hardware, a
//! build without the `verbs` feature) nothing changes: its absence never fails the plugin.
//!
//! This file is the plugin's only `unsafe` code: four FFI calls into libibverbs, each with a
//! `// SAFETY:` note. (The project keeps `unsafe` to the shim's hook layer otherwise.)

use super::hca::Inventory;

/// What libibverbs says about one port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VerbsPort {
    pub port: u32,
    /// `enum ibv_port_state` (4 = ACTIVE).
    pub state: u32,
    /// Physical state (5 = LinkUp).
    pub phys_state: u8,
}

/// `IBV_PORT_ACTIVE`.
pub const PORT_ACTIVE: u32 = 4;
/// Physical state LinkUp.
pub const PHYS_LINK_UP: u8 = 5;

/// Verbs' view of one device: its ports, or why it could not be opened.
pub type DeviceProbe = Result<Vec<VerbsPort>, String>;

/// Adds verbs-derived reasons to the inventory's health.
pub fn merge_probe(inv: &mut Inventory) {
    let names: Vec<(String, Vec<u32>)> = inv
        .hcas
        .iter()
        .map(|h| (h.name.clone(), h.ports.iter().map(|p| p.number).collect()))
        .collect();
    let probes = probe(&names);
    for hca in &mut inv.hcas {
        let Some(result) = probes.iter().find(|(n, _)| *n == hca.name).map(|(_, r)| r) else {
            continue;
        };
        match result {
            // Inconclusive, not unhealthy: an unprivileged container may see the device but
            // not be allowed to open it. sysfs stays the authority.
            Err(error) => tracing::debug!(hca = %hca.name, %error, "verbs probe inconclusive"),
            Ok(ports) => {
                let usable = ports
                    .iter()
                    .any(|p| p.state == PORT_ACTIVE && p.phys_state == PHYS_LINK_UP);
                if !usable && !ports.is_empty() {
                    for p in ports {
                        hca.health.reasons.push(format!(
                            "verbs: port {} state {} phys_state {}",
                            p.port, p.state, p.phys_state
                        ));
                    }
                }
            }
        }
    }
}

#[cfg(not(feature = "verbs"))]
fn probe(_devices: &[(String, Vec<u32>)]) -> Vec<(String, DeviceProbe)> {
    Vec::new()
}

#[cfg(feature = "verbs")]
#[allow(unsafe_code)]
fn probe(devices: &[(String, Vec<u32>)]) -> Vec<(String, DeviceProbe)> {
    use rdma_sys as ffi;
    use std::ffi::CStr;

    let mut out = Vec::new();
    let mut count: i32 = 0;
    // SAFETY: `count` is a valid out-pointer; the returned list is freed below exactly once.
    let list = unsafe { ffi::ibv_get_device_list(&mut count) };
    if list.is_null() {
        return out;
    }
    let count = usize::try_from(count).unwrap_or(0);
    for i in 0..count {
        // SAFETY: `list` holds `count` valid device pointers until ibv_free_device_list, and
        // ibv_get_device_name returns a NUL-terminated string owned by the device.
        let (dev, name) = unsafe {
            let dev = *list.add(i);
            let name = ffi::ibv_get_device_name(dev);
            if name.is_null() {
                continue;
            }
            (dev, CStr::from_ptr(name).to_string_lossy().into_owned())
        };
        let Some((_, ports)) = devices.iter().find(|(n, _)| *n == name) else {
            continue;
        };
        // SAFETY: `dev` is a live entry of the device list.
        let ctx = unsafe { ffi::ibv_open_device(dev) };
        if ctx.is_null() {
            out.push((name, Err("cannot open the device".to_string())));
            continue;
        }
        let mut states = Vec::new();
        for &port in ports {
            let Ok(port_u8) = u8::try_from(port) else {
                continue;
            };
            // SAFETY: `ctx` is an open context. The exported ibv_query_port fills the older,
            // shorter `_compat_ibv_port_attr` prefix of `ibv_port_attr`, so a zeroed full
            // struct is a large enough buffer; it lives across the call.
            let rc = unsafe {
                let mut attr: ffi::ibv_port_attr = std::mem::zeroed();
                let rc = ffi::ibv_query_port(
                    ctx,
                    port_u8,
                    (&raw mut attr).cast::<ffi::_compat_ibv_port_attr>(),
                );
                (rc == 0).then_some((attr.state, attr.phys_state))
            };
            if let Some((state, phys_state)) = rc {
                states.push(VerbsPort {
                    port,
                    state,
                    phys_state,
                });
            }
        }
        // SAFETY: `ctx` was opened above and is closed once.
        unsafe { ffi::ibv_close_device(ctx) };
        out.push((name, Ok(states)));
    }
    // SAFETY: `list` came from ibv_get_device_list and is freed once, after its last use.
    unsafe { ffi::ibv_free_device_list(list) };
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absent_devices_change_nothing() {
        // No RDMA hardware here: libibverbs finds no device named like this.
        let mut inv = Inventory::default();
        inv.hcas.push(crate::inventory::hca::Hca {
            name: "fixture_mlx5_0".into(),
            bus: crate::inventory::hca::Bus::Virtual,
            vendor: None,
            device_id: None,
            driver: None,
            numa_node: None,
            netdevs: vec![],
            ports: vec![],
            char_devices: vec![],
            health: crate::inventory::hca::Health::healthy(),
        });
        merge_probe(&mut inv);
        assert!(inv.hcas[0].health.is_healthy());
    }
}
