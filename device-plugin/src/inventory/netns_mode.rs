//! The kernel's RDMA network-namespace mode, read from `ib_core`'s `netns_mode` parameter.
//!
//! `<sysfs-root>/module/ib_core/parameters/netns_mode` is the live value of the kernel's
//! `ib_devices_shared_netns` (`rdma system set netns exclusive|shared` changes it): `Y` in
//! shared mode, the default, where every network namespace sees every RDMA device; `N` in
//! exclusive mode, where a device belongs to one namespace. This plugin hands out shared
//! per-HCA slots, which only work in shared mode: in exclusive mode a pod in its own network
//! namespace gets the char devices but not the device (the shim then stays on TCP). So the mode
//! is reported (`discover`, a log warning, `rdma_dp_netns_exclusive`), never acted on.

use std::{fs, path::Path};

use serde::Serialize;

/// Where the parameter lives below the sysfs root.
pub const PARAM: &str = "module/ib_core/parameters/netns_mode";

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum NetnsMode {
    Shared,
    Exclusive,
    /// `ib_core` is not loaded, or the value is unreadable.
    #[default]
    Unknown,
}

impl NetnsMode {
    /// Reads the mode below `sys_root`; anything unexpected is `Unknown`.
    pub fn read(sys_root: &Path) -> NetnsMode {
        match fs::read_to_string(sys_root.join(PARAM)) {
            Ok(value) => match value.trim() {
                "Y" | "y" | "1" => NetnsMode::Shared,
                "N" | "n" | "0" => NetnsMode::Exclusive,
                _ => NetnsMode::Unknown,
            },
            Err(_) => NetnsMode::Unknown,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            NetnsMode::Shared => "shared",
            NetnsMode::Exclusive => "exclusive",
            NetnsMode::Unknown => "unknown",
        }
    }
}

/// What an admin should know about `mode`, if anything.
pub fn advice(mode: NetnsMode) -> Option<&'static str> {
    (mode == NetnsMode::Exclusive).then_some(
        "the kernel's RDMA netns mode is exclusive: a pod in its own network namespace gets the \
         char devices of its slot but does not see the RDMA device, so its connections stay on \
         TCP; switch to shared mode (`rdma system set netns shared`, or ib_core netns_mode=1)",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_parameter_names_the_mode_and_anything_else_is_unknown() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(
            NetnsMode::read(dir.path()),
            NetnsMode::Unknown,
            "no ib_core"
        );
        let param = dir.path().join(PARAM);
        fs::create_dir_all(param.parent().unwrap()).unwrap();
        for (value, mode) in [
            ("Y\n", NetnsMode::Shared),
            ("N\n", NetnsMode::Exclusive),
            ("1", NetnsMode::Shared),
            ("0", NetnsMode::Exclusive),
            ("maybe\n", NetnsMode::Unknown),
            ("", NetnsMode::Unknown),
        ] {
            fs::write(&param, value).unwrap();
            assert_eq!(NetnsMode::read(dir.path()), mode, "{value:?}");
        }
        assert!(advice(NetnsMode::Exclusive).is_some());
        assert!(advice(NetnsMode::Shared).is_none() && advice(NetnsMode::Unknown).is_none());
    }

    /// The test kit's fixture writes the parameter where the plugin reads it.
    #[test]
    fn the_fixture_writes_the_parameter_read_here() {
        assert_eq!(rdma_device_plugin_testkit::fixture::NETNS_MODE_PARAM, PARAM);
    }
}
