//! Which path a connection ended on, and why.
//!
//! Every connection the shim sees ends counted as [`Path::Rdma`] (reason [`Reason::Upgraded`]) or
//! [`Path::Tcp`] with exactly one fallback reason (docs/shim-protocol.md, "Fallback reasons").
//! The upper-case names ([`Reason::as_str`]) and the numeric codes ([`Reason::code`], carried in
//! the side channel's REFUSE message) are stable: stats files, logs, tests and peers running other
//! shim versions depend on them. New reasons get new names and codes; old ones are never reused.

use std::fmt;
use std::str::FromStr;

/// The side of a connection the shim is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Role {
    /// The process called `connect()`.
    Client,
    /// The process `accept()`ed the connection.
    Server,
}

impl Role {
    /// Both roles, in index order.
    pub const ALL: [Role; 2] = [Role::Client, Role::Server];

    /// Stable lower-case name (`client`, `server`), as used in the stats JSON and the policy file.
    pub const fn as_str(self) -> &'static str {
        match self {
            Role::Client => "client",
            Role::Server => "server",
        }
    }

    /// Dense index (0..2), for counter arrays.
    pub const fn index(self) -> usize {
        match self {
            Role::Client => 0,
            Role::Server => 1,
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The path that carries a connection's bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Path {
    /// Upgraded: the bytes go over an RDMA stream.
    Rdma,
    /// Plain kernel TCP, byte for byte what the app would have had without the shim.
    Tcp,
}

impl Path {
    /// Both paths, in index order.
    pub const ALL: [Path; 2] = [Path::Rdma, Path::Tcp];

    /// Stable lower-case name (`rdma`, `tcp`).
    pub const fn as_str(self) -> &'static str {
        match self {
            Path::Rdma => "rdma",
            Path::Tcp => "tcp",
        }
    }

    /// Dense index (0..2), for counter arrays.
    pub const fn index(self) -> usize {
        match self {
            Path::Rdma => 0,
            Path::Tcp => 1,
        }
    }
}

impl fmt::Display for Path {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a connection ended on its path.
///
/// `Upgraded` goes with [`Path::Rdma`]; every other reason explains a [`Path::Tcp`] connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u16)]
pub enum Reason {
    /// Both ends agreed; the connection runs over RDMA.
    Upgraded = 0,
    /// `STREAMSHIM_DISABLE=1` (or the shim is otherwise switched off for this process).
    Disabled = 1,
    /// librdmacm or libibverbs (`STREAMSHIM_PROVIDER`) could not be loaded or bound.
    NoProvider = 2,
    /// No usable RDMA device.
    NoDevice = 3,
    /// `RLIMIT_MEMLOCK` too low and no `CAP_IPC_LOCK`.
    Memlock = 4,
    /// The policy (`STREAMSHIM_POLICY`) excludes this program, peer, port or role.
    Policy = 5,
    /// Nothing of ours answers at the peer: no RDMA listener there (no shim), another RDMA
    /// program, or no RDMA path.
    PeerNotShimmed = 6,
    /// The peer's shim answered REFUSE.
    PeerRefused = 7,
    /// The negotiation did not finish within `STREAMSHIM_NEGOTIATE_MS`.
    Timeout = 8,
    /// An RDMA call failed in a way that is not one of the above.
    RdmaError = 9,
    /// The peer failed recently and is still in the negative cache.
    NegativeCache = 10,
    /// Not a TCP stream socket (datagram, unix, raw, ...).
    NotTcp = 11,
    /// A socket use the shim does not upgrade (for example polled before `connect()`).
    Unsupported = 12,
    /// The RDMA device is iWARP, whose rdma_cm port space is the kernel's TCP ports.
    Iwarp = 13,
    /// Registered memory would not survive `fork()` here (no copy-on-fork in the kernel and
    /// `ibv_fork_init` failed).
    ForkUnsafe = 14,
    /// The connection ended, or was reset, on TCP before it moved to its stream: its bytes
    /// went over TCP as they came (a connection shorter than the stream's setup).
    EndedFirst = 15,
    /// A client connect to a virtual IP of the cluster (`STREAMSHIM_SERVICE_CIDRS`): only the
    /// kernel's NAT knows the backend, so no RDMA connect is tried.
    ServiceIp = 16,
}

impl Reason {
    /// Every reason, in code order (`ALL[i].code() == i`).
    pub const ALL: [Reason; 17] = [
        Reason::Upgraded,
        Reason::Disabled,
        Reason::NoProvider,
        Reason::NoDevice,
        Reason::Memlock,
        Reason::Policy,
        Reason::PeerNotShimmed,
        Reason::PeerRefused,
        Reason::Timeout,
        Reason::RdmaError,
        Reason::NegativeCache,
        Reason::NotTcp,
        Reason::Unsupported,
        Reason::Iwarp,
        Reason::ForkUnsafe,
        Reason::EndedFirst,
        Reason::ServiceIp,
    ];

    /// Number of reasons (length of [`Reason::ALL`]).
    pub const COUNT: usize = Reason::ALL.len();

    /// Stable upper-case name, for example `PEER_NOT_SHIMMED`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Reason::Upgraded => "UPGRADED",
            Reason::Disabled => "DISABLED",
            Reason::NoProvider => "NO_PROVIDER",
            Reason::NoDevice => "NO_DEVICE",
            Reason::Memlock => "MEMLOCK",
            Reason::Policy => "POLICY",
            Reason::PeerNotShimmed => "PEER_NOT_SHIMMED",
            Reason::PeerRefused => "PEER_REFUSED",
            Reason::Timeout => "TIMEOUT",
            Reason::RdmaError => "RDMA_ERROR",
            Reason::NegativeCache => "NEGATIVE_CACHE",
            Reason::NotTcp => "NOT_TCP",
            Reason::Unsupported => "UNSUPPORTED",
            Reason::Iwarp => "IWARP",
            Reason::ForkUnsafe => "FORK_UNSAFE",
            Reason::EndedFirst => "ENDED_FIRST",
            Reason::ServiceIp => "SERVICE_IP",
        }
    }

    /// Stable numeric code (the REFUSE payload's reason field). Equals the index in [`Reason::ALL`].
    pub const fn code(self) -> u16 {
        self as u16
    }

    /// Dense index (0..[`Reason::COUNT`]), for counter arrays.
    pub const fn index(self) -> usize {
        self as usize
    }

    /// The reason with this numeric code; `None` for codes this version does not know
    /// (a newer peer may send them: treat as "refused, reason unknown").
    pub const fn from_code(code: u16) -> Option<Reason> {
        match code {
            0 => Some(Reason::Upgraded),
            1 => Some(Reason::Disabled),
            2 => Some(Reason::NoProvider),
            3 => Some(Reason::NoDevice),
            4 => Some(Reason::Memlock),
            5 => Some(Reason::Policy),
            6 => Some(Reason::PeerNotShimmed),
            7 => Some(Reason::PeerRefused),
            8 => Some(Reason::Timeout),
            9 => Some(Reason::RdmaError),
            10 => Some(Reason::NegativeCache),
            11 => Some(Reason::NotTcp),
            12 => Some(Reason::Unsupported),
            13 => Some(Reason::Iwarp),
            14 => Some(Reason::ForkUnsafe),
            15 => Some(Reason::EndedFirst),
            16 => Some(Reason::ServiceIp),
            _ => None,
        }
    }

    /// The path a connection with this reason is on: `Rdma` for `Upgraded`, `Tcp` otherwise.
    pub const fn path(self) -> Path {
        match self {
            Reason::Upgraded => Path::Rdma,
            _ => Path::Tcp,
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The string is not one of the stable reason names.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown reason name {0:?}")]
pub struct UnknownReason(pub String);

impl FromStr for Reason {
    type Err = UnknownReason;

    /// Parses a stable name; ASCII case and `-`/`_` are not significant
    /// (`peer-not-shimmed` parses as `PEER_NOT_SHIMMED`).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        Reason::ALL
            .iter()
            .copied()
            .find(|r| eq_name(r.as_str(), s))
            .ok_or_else(|| UnknownReason(s.to_owned()))
    }
}

fn eq_name(canonical: &str, s: &str) -> bool {
    canonical.len() == s.len()
        && canonical.bytes().zip(s.bytes()).all(|(c, b)| {
            let b = if b == b'-' { b'_' } else { b };
            c == b.to_ascii_uppercase()
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn names_are_the_documented_ones() {
        let names: Vec<&str> = Reason::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(
            names,
            [
                "UPGRADED",
                "DISABLED",
                "NO_PROVIDER",
                "NO_DEVICE",
                "MEMLOCK",
                "POLICY",
                "PEER_NOT_SHIMMED",
                "PEER_REFUSED",
                "TIMEOUT",
                "RDMA_ERROR",
                "NEGATIVE_CACHE",
                "NOT_TCP",
                "UNSUPPORTED",
                "IWARP",
                "FORK_UNSAFE",
                "ENDED_FIRST",
                "SERVICE_IP",
            ]
        );
    }

    #[test]
    fn the_docs_tables_list_every_reason_in_code_order() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let guide = std::fs::read_to_string(root.join("docs/shim.md")).unwrap();
        let section = guide
            .split("\n## Reasons and stats\n")
            .nth(1)
            .and_then(|s| s.split("\n## ").next())
            .expect("docs/shim.md has a Reasons and stats section");
        let rows: Vec<(&str, &str)> = section
            .lines()
            .filter_map(|line| {
                let cells: Vec<&str> = line.split('|').map(str::trim).collect();
                let name = cells.get(1)?.strip_prefix('`')?.strip_suffix('`')?;
                Some((name, *cells.get(2)?))
            })
            .collect();
        let want: Vec<(&str, &str)> = Reason::ALL
            .iter()
            .map(|r| {
                let path = if *r == Reason::Upgraded {
                    "rdma"
                } else {
                    "tcp"
                };
                (r.as_str(), path)
            })
            .collect();
        assert_eq!(rows, want, "docs/shim.md's reason table");
        let protocol = std::fs::read_to_string(root.join("docs/shim-protocol.md")).unwrap();
        let codes = Reason::ALL
            .iter()
            .map(|r| format!("{} {}", r.as_str(), r.code()))
            .collect::<Vec<_>>()
            .join(", ");
        let flat = protocol.split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(
            flat.contains(&format!(
                "Reason codes (u16, `shim/core/src/reason.rs`): {codes}."
            )),
            "docs/shim-protocol.md's reason codes: want {codes}"
        );
    }

    #[test]
    fn codes_are_dense_and_unique() {
        let mut seen = HashSet::new();
        for (i, r) in Reason::ALL.iter().enumerate() {
            assert_eq!(r.code() as usize, i);
            assert_eq!(r.index(), i);
            assert!(seen.insert(r.as_str()));
            assert_eq!(Reason::from_code(r.code()), Some(*r));
        }
        assert_eq!(Reason::from_code(Reason::COUNT as u16), None);
        assert_eq!(Reason::from_code(u16::MAX), None);
    }

    #[test]
    fn parse_roundtrip_and_leniency() {
        for r in Reason::ALL {
            assert_eq!(r.as_str().parse::<Reason>(), Ok(r));
            assert_eq!(r.to_string(), r.as_str());
            assert_eq!(r.as_str().to_ascii_lowercase().parse::<Reason>(), Ok(r));
        }
        assert_eq!(
            "peer-not-shimmed".parse::<Reason>(),
            Ok(Reason::PeerNotShimmed)
        );
        assert_eq!(" TIMEOUT\n".parse::<Reason>(), Ok(Reason::Timeout));
        assert!("TIMEOUTS".parse::<Reason>().is_err());
        assert!("".parse::<Reason>().is_err());
        assert!("ÜPGRADED".parse::<Reason>().is_err());
        let err = "nope".parse::<Reason>().unwrap_err();
        assert_eq!(err.to_string(), "unknown reason name \"nope\"");
    }

    #[test]
    fn paths_and_roles() {
        assert_eq!(Reason::Upgraded.path(), Path::Rdma);
        for r in &Reason::ALL[1..] {
            assert_eq!(r.path(), Path::Tcp);
        }
        assert_eq!(Path::Rdma.to_string(), "rdma");
        assert_eq!(Path::Tcp.as_str(), "tcp");
        assert_eq!(Role::Client.to_string(), "client");
        assert_eq!(Role::Server.as_str(), "server");
        for (i, p) in Path::ALL.iter().enumerate() {
            assert_eq!(p.index(), i);
        }
        for (i, r) in Role::ALL.iter().enumerate() {
            assert_eq!(r.index(), i);
        }
    }
}
