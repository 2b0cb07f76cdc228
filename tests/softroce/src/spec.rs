//! What to boot: [`GuestSpec`], its network ([`Net`]) and the side of a wire ([`WireRole`]).

use std::fmt;
use std::net::{Ipv4Addr, TcpListener};
use std::time::Duration;

/// The loop topology's two addresses (veth `va` and `vb`, rxe devices `rxea` and `rxeb`).
pub const LOOP_ADDRS: (Ipv4Addr, Ipv4Addr) =
    (Ipv4Addr::new(198, 18, 0, 1), Ipv4Addr::new(198, 18, 0, 2));
/// The wire topology's addresses of guest A and guest B (rxe device `rxe0` on each).
pub const WIRE_ADDRS: (Ipv4Addr, Ipv4Addr) =
    (Ipv4Addr::new(198, 18, 1, 1), Ipv4Addr::new(198, 18, 1, 2));

/// One side of a two-guest wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WireRole {
    /// Listens on the QEMU socket netdev; 198.18.1.1.
    A,
    /// Connects to A's socket netdev; 198.18.1.2.
    B,
}

impl WireRole {
    /// "a" or "b" (`SOFTROCE_ROLE` in the guest).
    pub fn as_str(self) -> &'static str {
        match self {
            WireRole::A => "a",
            WireRole::B => "b",
        }
    }

    /// The other side.
    pub fn peer(self) -> WireRole {
        match self {
            WireRole::A => WireRole::B,
            WireRole::B => WireRole::A,
        }
    }

    /// The MAC of this side's virtio NIC.
    pub fn mac(self) -> &'static str {
        match self {
            WireRole::A => "52:54:00:00:00:01",
            WireRole::B => "52:54:00:00:00:02",
        }
    }
}

impl fmt::Display for WireRole {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A guest's network.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Net {
    /// One guest, both ends inside it: a veth pair with an rxe device on each end.
    Loop,
    /// One of two guests joined by a QEMU socket netdev on `127.0.0.1:port` (A listens, B
    /// connects). Port 0: [`crate::run_pair`] picks a free one.
    Wire {
        /// Which side this guest is.
        role: WireRole,
        /// The TCP port of the socket netdev on the host's loopback.
        port: u16,
    },
}

impl Net {
    /// `SOFTROCE_ROLE` in the guest: "loop", "a" or "b".
    pub fn role_str(self) -> &'static str {
        match self {
            Net::Loop => "loop",
            Net::Wire { role, .. } => role.as_str(),
        }
    }

    /// The QEMU options of a wire side (none for the loop).
    pub fn qemu_opts(self) -> Option<String> {
        match self {
            Net::Loop => None,
            Net::Wire { role, port } => {
                let mode = match role {
                    WireRole::A => "listen",
                    WireRole::B => "connect",
                };
                Some(format!(
                    "-netdev socket,id=n0,{mode}=127.0.0.1:{port} \
                     -device virtio-net-pci,netdev=n0,mac={}",
                    role.mac()
                ))
            }
        }
    }
}

/// A guest to boot and the command it runs.
#[derive(Clone, Debug)]
pub struct GuestSpec {
    /// A short name: the guest's hostname (`softroce-<name>`) and its work directory's name.
    /// Letters, digits, `-` and `_`.
    pub name: String,
    /// Guest memory in QEMU's notation (default "3G").
    pub memory: String,
    /// Guest CPUs (default 2).
    pub cpus: u32,
    /// The command run inside, after the topology is up (argv; empty: set up and power off).
    pub command: Vec<String>,
    /// Variables for the command, on top of the `SOFTROCE_*` ones the init script exports.
    pub env: Vec<(String, String)>,
    /// The topology.
    pub net: Net,
    /// The whole run, boot included; then QEMU and everything it started are killed.
    pub timeout: Duration,
}

impl GuestSpec {
    /// A loop guest running `command`, with the defaults (3G, 2 CPUs, 10 minutes).
    pub fn new(
        name: impl Into<String>,
        command: impl IntoIterator<Item = impl Into<String>>,
    ) -> Self {
        GuestSpec {
            name: name.into(),
            memory: "3G".into(),
            cpus: 2,
            command: command.into_iter().map(Into::into).collect(),
            env: Vec::new(),
            net: Net::Loop,
            timeout: Duration::from_secs(600),
        }
    }

    /// Sets the network.
    pub fn net(mut self, net: Net) -> Self {
        self.net = net;
        self
    }

    /// Adds a variable for the command.
    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    /// Sets the timeout of the whole run.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Sets the memory (QEMU notation, "3G").
    pub fn memory(mut self, memory: impl Into<String>) -> Self {
        self.memory = memory.into();
        self
    }

    /// Sets the CPU count.
    pub fn cpus(mut self, cpus: u32) -> Self {
        self.cpus = cpus;
        self
    }

    pub(crate) fn validate(&self) -> Result<(), crate::Error> {
        let bad = |what: String| {
            Err(crate::Error::Invalid(format!(
                "guest {:?}: {what}",
                self.name
            )))
        };
        if self.name.is_empty()
            || !self
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return bad("the name must be letters, digits, '-' and '_'".into());
        }
        for (k, _) in &self.env {
            let mut chars = k.chars();
            let ok = chars
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
            if !ok {
                return bad(format!("{k:?} is not a variable name"));
            }
        }
        if self.cpus == 0 {
            return bad("cpus must be at least 1".into());
        }
        Ok(())
    }
}

/// A TCP port on 127.0.0.1 that was free a moment ago.
pub fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?
        .local_addr()?
        .port())
}
