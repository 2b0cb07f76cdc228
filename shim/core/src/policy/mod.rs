//! Which connections may upgrade: the `STREAMSHIM_POLICY` file.
//!
//! The pod opted in, so with no policy file every TCP connection may upgrade (loopback excepted,
//! see below); a policy only narrows that. The file is small YAML, parsed once per process:
//!
//! ```yaml
//! version: 1                          # optional; only 1 is accepted
//! programs: [iperf3, "qemu-system-*"] # basename of /proc/self/exe or argv[0]; `*` and `?`
//!                                     # globs; absent or empty = every program
//! exclude_programs: [sshd, "kube*"]   # never upgrade these (beats `programs`)
//! loopback: false                     # upgrade loopback/unspecified peers (default false)
//! client:                             # connections this process makes (connect)
//!   enabled: true                     # default true; false = never upgrade as client
//!   allow:                            # peer address rules; absent or empty = every peer
//!     - {cidr: 10.0.0.0/8, ports: [5201, "8000-8100"]}
//!     - {cidr: "fd00::/8"}
//!   deny:                             # deny beats allow
//!     - {cidr: 10.0.5.0/24}
//!     - {ports: [22]}
//! server:                             # connections this process accepts
//!   allow:
//!     - {ports: [5201]}               # ports = local (listen) ports; cidr = the client's address
//!   deny:
//!     - {cidr: 10.9.0.0/16, ports: [5201]}
//! ```
//!
//! A rule is a mapping with optional `cidr` (an address or `address/prefix`, IPv4 or IPv6; host
//! bits are ignored) and optional `ports` (a list of numbers and `"lo-hi"` ranges). An absent
//! field matches everything, so `{}` matches every connection. A rule matches when both fields
//! match. IPv4 and IPv4-mapped IPv6 (`::ffff:a.b.c.d`) are the same address for matching, both
//! for peers and for CIDRs, so `10.0.0.0/8` matches the peer `::ffff:10.1.2.3` (and `::/0`
//! matches every address).
//!
//! Loopback (127.0.0.0/8, ::1) and unspecified (0.0.0.0, ::) peers stay on TCP unless
//! `loopback: true` (docs/shim-protocol.md: rdma_cm has no loopback device on most HCAs).
//!
//! Unknown fields, bad CIDRs, bad ports and YAML errors are errors with line and column. The shim
//! turns any error into pass-through plus one stderr line ([`PolicyError`]'s `Display` is one
//! line). Checks ([`Policy::client_allows`], [`Policy::server_allows`],
//! [`Policy::program_allowed`]) never allocate and never panic.
//!
//! One concept per file: peer networks ([`Cidr`], `cidr.rs`), port lists ([`PortRange`],
//! `ports.rs`), program globs ([`ProgramPattern`], `program.rs`), a role's rules ([`Rule`],
//! [`RolePolicy`], `rules.rs`), where the file comes from ([`PolicySource`], `source.rs`) and
//! why it cannot be used ([`PolicyError`], `error.rs`); the [`Policy`] that joins them is here.

mod cidr;
mod error;
mod ports;
mod program;
mod rules;
mod source;

use std::fmt;
use std::io::Read;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;

use serde::Deserialize;
use serde::de::{self, Deserializer, Visitor};

pub use cidr::{Cidr, CidrError, canonical_ip, is_local_peer};
pub use error::PolicyError;
pub use ports::PortRange;
pub use program::{ProgramPattern, basename, current_program_names};
pub use rules::{RolePolicy, Rule};
pub use source::PolicySource;

use rules::{null_as_default, null_as_empty};

/// Largest policy file read (bytes); anything bigger is an error.
pub const MAX_POLICY_BYTES: u64 = 1 << 20;

/// The `version` field: absent, null or 1.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct FormatVersion;

impl<'de> Deserialize<'de> for FormatVersion {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = FormatVersion;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("policy version 1")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<FormatVersion, E> {
                if v == 1 {
                    Ok(FormatVersion)
                } else {
                    Err(E::custom(format!(
                        "unsupported policy version {v} (this shim reads version 1)"
                    )))
                }
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<FormatVersion, E> {
                match u64::try_from(v) {
                    Ok(u) => self.visit_u64(u),
                    Err(_) => Err(E::custom(format!("unsupported policy version {v}"))),
                }
            }
            fn visit_unit<E: de::Error>(self) -> Result<FormatVersion, E> {
                Ok(FormatVersion)
            }
        }
        d.deserialize_any(V)
    }
}

/// The parsed policy. [`Policy::default`] is [`Policy::allow_all`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Policy {
    /// Checked on parse (only 1, or absent); nothing to keep.
    #[serde(default)]
    version: FormatVersion,
    /// Programs that may upgrade (globs over the basename); empty = all.
    #[serde(default, deserialize_with = "null_as_empty")]
    pub programs: Vec<ProgramPattern>,
    /// Programs that never upgrade; beats `programs`.
    #[serde(default, deserialize_with = "null_as_empty")]
    pub exclude_programs: Vec<ProgramPattern>,
    /// Whether loopback and unspecified peers may upgrade.
    #[serde(default)]
    pub loopback: bool,
    /// Rules for connections this process makes.
    #[serde(default, deserialize_with = "null_as_default")]
    pub client: RolePolicy,
    /// Rules for connections this process accepts.
    #[serde(default, deserialize_with = "null_as_default")]
    pub server: RolePolicy,
}

impl Policy {
    /// The policy without a file: every program, peer and port may upgrade, loopback excepted.
    pub fn allow_all() -> Policy {
        Policy::default()
    }

    /// Parses policy YAML. An empty document (or only comments) is [`Policy::allow_all`].
    pub fn parse(text: &str) -> Result<Policy, PolicyError> {
        Self::from_yaml(text, None)
    }

    /// Parses `text` (from `path`, if given), with the workspace's YAML options (bounded
    /// nesting, aliases and size: `rdma_streams_yaml`).
    fn from_yaml(text: &str, path: Option<&Path>) -> Result<Policy, PolicyError> {
        match rdma_streams_yaml::from_str::<Option<Policy>>(text) {
            Ok(p) => Ok(p.unwrap_or_default()),
            Err(e) => Err(PolicyError::from_yaml(path, &e)),
        }
    }

    /// Reads and parses the file at `path` (at most [`MAX_POLICY_BYTES`]).
    pub fn load(path: &Path) -> Result<Policy, PolicyError> {
        let read_err = |source| PolicyError::Read {
            path: path.to_owned(),
            source,
        };
        let file = std::fs::File::open(path).map_err(read_err)?;
        let mut text = String::new();
        file.take(MAX_POLICY_BYTES.saturating_add(1))
            .read_to_string(&mut text)
            .map_err(read_err)?;
        if text.len() as u64 > MAX_POLICY_BYTES {
            return Err(PolicyError::TooLarge {
                path: path.to_owned(),
            });
        }
        Self::from_yaml(&text, Some(path))
    }

    /// Whether the program with this basename may upgrade at all (a path is reduced to its
    /// basename first). Exclusions beat `programs`; empty `programs` allows every program.
    pub fn program_allowed(&self, exe_basename: &str) -> bool {
        let name = basename(exe_basename);
        !self.exclude_programs.iter().any(|p| p.matches(name))
            && (self.programs.is_empty() || self.programs.iter().any(|p| p.matches(name)))
    }

    /// For a process known by several names (exe and `argv[0]` basenames, see
    /// [`current_program_names`]): no name excluded, and some name allowed (or `programs`
    /// empty). No names at all: allowed only when `programs` is empty.
    pub fn program_allowed_any<S: AsRef<str>>(&self, names: &[S]) -> bool {
        let excluded = names.iter().any(|n| {
            let n = basename(n.as_ref());
            self.exclude_programs.iter().any(|p| p.matches(n))
        });
        !excluded
            && (self.programs.is_empty()
                || names.iter().any(|n| {
                    let n = basename(n.as_ref());
                    self.programs.iter().any(|p| p.matches(n))
                }))
    }

    /// Whether a `connect()` to `peer` may try to upgrade.
    pub fn client_allows(&self, peer: SocketAddr) -> bool {
        let ip = canonical_ip(peer.ip());
        (self.loopback || !is_local_peer(ip)) && self.client.allows(ip, peer.port())
    }

    /// Whether a connection accepted on `local_port` from `peer` may upgrade (the server side of
    /// the HELLO: `peer` is the client's TCP address).
    pub fn server_allows(&self, local_port: u16, peer: IpAddr) -> bool {
        let ip = canonical_ip(peer);
        (self.loopback || !is_local_peer(ip)) && self.server.allows(ip, local_port)
    }
}

#[cfg(test)]
mod fuzz;

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::ffi::OsStr;
    use std::net::{Ipv4Addr, SocketAddrV4, SocketAddrV6};

    fn sa(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }
    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    /// The documented example, whole (also a seed of the fuzz tests).
    pub(super) const FULL: &str = r#"
# full example
version: 1
programs: [iperf3, "qemu-system-*"]
exclude_programs: [sshd, "kube*"]
loopback: false
client:
  enabled: true
  allow:
    - {cidr: 10.0.0.0/8, ports: [5201, "8000-8100"]}
    - {cidr: "fd00::/8"}
  deny:
    - {cidr: 10.0.5.0/24}
    - {ports: [22]}
server:
  allow:
    - {ports: [5201]}
  deny:
    - {cidr: 10.9.0.0/16, ports: [5201]}
"#;

    #[test]
    fn full_example_parses_and_behaves() {
        let p = Policy::parse(FULL).unwrap();
        // programs
        assert!(p.program_allowed("iperf3"));
        assert!(p.program_allowed("/usr/bin/iperf3"));
        assert!(p.program_allowed("qemu-system-x86_64"));
        assert!(!p.program_allowed("curl"));
        assert!(!p.program_allowed("sshd"));
        assert!(p.program_allowed_any(&["qemu-system-x86_64", "qemu"]));
        assert!(!p.program_allowed_any(&["python3.11", "python3"]));
        assert!(!p.program_allowed_any::<&str>(&[]));
        // client
        assert!(p.client_allows(sa("10.1.2.3:5201")));
        assert!(p.client_allows(sa("10.1.2.3:8050")));
        assert!(p.client_allows(sa("10.1.2.3:8100")));
        assert!(!p.client_allows(sa("10.1.2.3:8101")));
        assert!(!p.client_allows(sa("10.0.5.7:5201")), "deny beats allow");
        assert!(
            !p.client_allows(sa("[::ffff:10.0.5.7]:5201")),
            "mapped deny"
        );
        assert!(
            p.client_allows(sa("[::ffff:10.0.6.7]:5201")),
            "mapped allow"
        );
        assert!(!p.client_allows(sa("192.168.1.1:5201")));
        assert!(p.client_allows(sa("[fd00::1]:443")));
        assert!(!p.client_allows(sa("[fd00::1]:22")), "port deny");
        assert!(!p.client_allows(sa("127.0.0.1:5201")));
        // server
        assert!(p.server_allows(5201, ip("10.1.1.1")));
        assert!(p.server_allows(5201, ip("2001:db8::1")));
        assert!(!p.server_allows(5202, ip("10.1.1.1")));
        assert!(!p.server_allows(5201, ip("10.9.1.1")));
        assert!(!p.server_allows(5201, ip("::ffff:10.9.1.1")));
        assert!(!p.server_allows(5201, ip("::1")));
        assert!(!p.server_allows(5201, ip("::ffff:127.0.0.1")));
    }

    #[test]
    fn allow_all_and_empty() {
        for text in ["", "# only a comment\n", "~", "---\n", "{}", "version: 1"] {
            let p = Policy::parse(text).unwrap();
            assert_eq!(p, Policy::allow_all(), "{text:?}");
        }
        let p = Policy::allow_all();
        assert!(p.program_allowed("anything"));
        assert!(p.program_allowed_any::<&str>(&[]));
        assert!(p.client_allows(sa("8.8.8.8:1")));
        assert!(p.client_allows(sa("[2001:db8::1]:1")));
        assert!(p.server_allows(1, ip("10.0.0.1")));
        // Loopback and unspecified stay TCP by default.
        for l in [
            "127.0.0.1:1",
            "127.9.9.9:1",
            "[::1]:1",
            "0.0.0.0:1",
            "[::]:1",
            "[::ffff:127.0.0.1]:1",
        ] {
            assert!(!p.client_allows(sa(l)), "{l}");
        }
        assert!(!p.server_allows(1, ip("127.0.0.1")));
    }

    #[test]
    fn loopback_switch() {
        let p = Policy::parse("loopback: true").unwrap();
        assert!(p.client_allows(sa("127.0.0.1:5201")));
        assert!(p.client_allows(sa("[::1]:5201")));
        assert!(p.server_allows(5201, ip("127.0.0.1")));
        // Still subject to the rules.
        let p = Policy::parse("loopback: true\nclient: {deny: [{cidr: 127.0.0.0/8}]}").unwrap();
        assert!(!p.client_allows(sa("127.0.0.1:5201")));
        assert!(p.client_allows(sa("[::1]:5201")));
    }

    #[test]
    fn role_enabled_and_nulls() {
        let p = Policy::parse("client:\n  enabled: false\nserver:\n").unwrap();
        assert!(!p.client_allows(sa("10.0.0.1:80")));
        assert!(p.server_allows(80, ip("10.0.0.1")));
        let p = Policy::parse("programs:\nclient:\n  allow:\n  deny:\n").unwrap();
        assert_eq!(p, Policy::allow_all());
        // `{}` matches everything.
        let p = Policy::parse("server: {deny: [{}]}").unwrap();
        assert!(!p.server_allows(80, ip("10.0.0.1")));
        assert!(p.client_allows(sa("10.0.0.1:80")));
    }

    #[test]
    fn rule_with_only_ports_or_only_cidr() {
        let p = Policy::parse("client: {allow: [{ports: [\"1000-2000\"]}, {cidr: 192.0.2.0/24}]}")
            .unwrap();
        assert!(p.client_allows(sa("8.8.8.8:1500")));
        assert!(!p.client_allows(sa("8.8.8.8:2500")));
        assert!(p.client_allows(sa("192.0.2.9:2500")));
        let p = Policy::parse("server: {allow: [{cidr: 192.0.2.0/24, ports: [80, 443]}]}").unwrap();
        assert!(p.server_allows(443, ip("192.0.2.1")));
        assert!(!p.server_allows(8443, ip("192.0.2.1")));
        assert!(!p.server_allows(443, ip("192.0.3.1")));
    }

    #[test]
    fn errors_have_locations_and_one_line() {
        let cases: &[(&str, (usize, usize), &str)] = &[
            (
                "client:\n  allow:\n    - {cidr: 10.0.0.0/8, portz: [1]}\n",
                (3, 26),
                "unknown field `portz`",
            ),
            ("programz: [a]\n", (1, 1), "unknown field `programz`"),
            (
                "client:\n  allow: [{cidr: 10.0.0.0/33}]\n",
                (2, 18),
                "IPv4 prefix length above 32",
            ),
            (
                "server:\n  allow: [{ports: [70000]}]\n",
                (2, 20),
                "port 70000 is above 65535",
            ),
            ("server:\n  allow: [{ports: [\"9-1\"]}]\n", (2, 20), "empty"),
            (
                "server:\n  allow: [{ports: [-3]}]\n",
                (2, 20),
                "out of range",
            ),
            ("loopback: maybe\n", (1, 11), "invalid boolean"),
            ("version: 2\n", (1, 10), "unsupported policy version 2"),
            ("programs: [\"/usr/bin/iperf3\"]\n", (1, 12), "basename"),
            ("programs: [\"\"]\n", (1, 12), "empty program pattern"),
            ("client: [1, 2]\n", (1, 9), "expected mapping"),
            (
                "client:\n  allow: {cidr: 10.0.0.0/8}\n",
                (2, 10),
                "expected sequence",
            ),
        ];
        for (text, loc, needle) in cases {
            let e = Policy::parse(text).unwrap_err();
            let msg = e.to_string();
            assert_eq!(e.location(), Some(*loc), "{text:?}: {msg}");
            assert!(msg.contains(needle), "{text:?}: {msg}");
            assert!(!msg.contains('\n'), "{msg}");
            assert!(
                msg.starts_with(&format!("policy: line {} column {}: ", loc.0, loc.1)),
                "{msg}"
            );
            assert!(
                !msg.ends_with(&format!("at line {} column {}", loc.0, loc.1)),
                "{msg}"
            );
        }
        // Syntax error.
        let e = Policy::parse("client: {allow: [\n").unwrap_err();
        assert!(e.location().is_some(), "{e}");
        assert!(!e.to_string().contains('\n'));
        // Multiple documents.
        let e = Policy::parse("---\na: 1\n---\nb: 2\n").unwrap_err();
        assert!(!e.to_string().contains('\n'));
    }

    #[test]
    fn load_and_source() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("policy.yaml");
        std::fs::write(&path, FULL).unwrap();
        let p = Policy::load(&path).unwrap();
        assert_eq!(p, Policy::parse(FULL).unwrap());

        let src = PolicySource::from_value(Some(path.as_os_str()));
        assert_eq!(src, PolicySource::File(path.clone()));
        assert_eq!(src.load().unwrap(), p);
        assert_eq!(PolicySource::from_value(None), PolicySource::Default);
        assert_eq!(
            PolicySource::from_value(Some(OsStr::new(""))),
            PolicySource::Default
        );
        assert_eq!(PolicySource::Default.load().unwrap(), Policy::allow_all());

        // Missing file.
        let missing = dir.path().join("nope.yaml");
        let e = PolicySource::File(missing.clone()).load().unwrap_err();
        assert!(matches!(e, PolicyError::Read { .. }));
        let msg = e.to_string();
        assert!(
            msg.starts_with(&format!("policy {}: cannot read: ", missing.display())),
            "{msg}"
        );
        assert!(!msg.contains('\n'));

        // A directory.
        assert!(matches!(
            Policy::load(dir.path()),
            Err(PolicyError::Read { .. })
        ));

        // Bad content names the file and the line.
        std::fs::write(&path, "client:\n  bogus: 1\n").unwrap();
        let msg = Policy::load(&path).unwrap_err().to_string();
        assert!(
            msg.starts_with(&format!("policy {}: line 2 column 3: ", path.display())),
            "{msg}"
        );

        // Not UTF-8.
        std::fs::write(&path, b"programs: [\xff]\n").unwrap();
        assert!(Policy::load(&path).is_err());

        // Too large.
        let big = format!("# {}\n", "x".repeat(MAX_POLICY_BYTES as usize));
        std::fs::write(&path, big).unwrap();
        assert!(matches!(
            Policy::load(&path),
            Err(PolicyError::TooLarge { .. })
        ));

        // Empty file.
        std::fs::write(&path, "").unwrap();
        assert_eq!(Policy::load(&path).unwrap(), Policy::allow_all());
    }

    #[test]
    fn allow_all_takes_this_process() {
        let names = current_program_names();
        let p = Policy::allow_all();
        assert!(p.program_allowed_any(&names));
    }

    proptest! {
        #[test]
        fn mapped_and_plain_v4_agree(v in any::<u32>(), port in any::<u16>()) {
            let p = Policy::parse(FULL).unwrap();
            let v4 = Ipv4Addr::from(v);
            let plain = SocketAddr::V4(SocketAddrV4::new(v4, port));
            let mapped = SocketAddr::V6(SocketAddrV6::new(v4.to_ipv6_mapped(), port, 0, 0));
            prop_assert_eq!(p.client_allows(plain), p.client_allows(mapped));
            prop_assert_eq!(
                p.server_allows(port, plain.ip()),
                p.server_allows(port, mapped.ip())
            );
        }

        #[test]
        fn parse_never_panics(s in "\\PC{0,200}") {
            let _ = Policy::parse(&s);
        }
    }
}
